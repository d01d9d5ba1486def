// The shared key of the integrity mode (EngineConfig::integrity_key), read
// from a file that holds it as 64 hexadecimal digits (a trailing newline is
// fine), as WireGuard keeps its keys: never on a command line, where other
// users could read it. Make one with: head -c32 /dev/urandom | xxd -p -c64
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace vstellar {

bool ReadIntegrityKey(const std::string& path, std::array<uint8_t, 32>* key, std::string* err);

}  // namespace vstellar
