"""The fabric experiments behind tools/fabric/exp_*, one module each."""
