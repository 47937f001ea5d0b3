// The tiny checkpoint of a family ("v4" or "v41") for the engine and model tests: written once per test
// process by tools/make_checkpoint.py (seed 0) into a temporary directory; empty when python3/numpy are
// missing (the tests that need it skip then).
#pragma once

#include <cstdlib>
#include <map>
#include <string>

#include "st_writer.h"

inline const std::string& tiny_checkpoint(const std::string& family = "v4") {
  static st_test::TempDir dir;
  static std::map<std::string, std::string> paths;
  auto it = paths.find(family);
  if (it != paths.end()) return it->second;
  const std::string out = (dir / ("tiny-" + family)).string();
  const std::string cmd = "python3 " DEEPINFER_SOURCE_DIR "/tools/make_checkpoint.py --family " + family +
                          " --preset tiny --seed 0 --out " + out + " > /dev/null 2>&1";
  return paths[family] = std::system(cmd.c_str()) == 0 ? out : std::string();
}
