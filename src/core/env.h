// The DEEPINFER_* environment variables: one table says which exist (DeepInfer's names where it
// has one), what they do, their default, and whether this build implements them. check_env() warns
// once about set variables that are not implemented yet (they are ignored, never half-applied) and
// about unknown DEEPINFER_* names (typos); `deepinfer env` prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

struct EnvVar {
  const char* name;
  const char* default_value;
  const char* meaning;
  bool supported;  // false: accepted and reported as not supported yet
};

const std::vector<EnvVar>& env_vars();
void check_env();
std::string env_table();  // the table as text, with each variable's current value
// The variable's value when set, else its default from the table (name must be in the table).
std::string env_value(const char* name);
// env_value as a whole number >= min_value; a clear error otherwise (the tuning row counts).
int64_t env_int(const char* name, int64_t min_value);
// env_value as a switch: one digit from 0 to max_value (at most 9); a clear error otherwise.
int env_switch(const char* name, int max_value);

}  // namespace deepinfer
