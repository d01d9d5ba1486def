"""The guest benchmarks behind tools/bench/{guest,nvmeof,startup,ucx}/run."""
