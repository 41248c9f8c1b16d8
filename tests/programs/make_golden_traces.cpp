// ampactor-make-golden-traces DIR: writes the golden traces (tests/golden_traces.h) into DIR.
// Regenerate with: ampactor-make-golden-traces tests/traces
#include <iostream>
#include <memory>
#include <string>

#include "golden_traces.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ampactor-make-golden-traces DIR\n";
    return 2;
  }
  try {
    for (const auto& g : ampactor::test::golden_traces()) {
      const std::string path = std::string(argv[1]) + "/" + g.file;
      auto file = std::make_shared<ampactor::TraceFile>(path);
      g.make(file);
      if (!file->close()) throw std::runtime_error("writing " + path + " failed");
      std::cout << path << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "ampactor-make-golden-traces: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
