// kiln-train: trains a zoo model from the command line (see `kiln-train --help`).
#include <csignal>
#include <cstring>
#include <iostream>

#include "tools/report_errors.h"
#include "tools/trainer.h"

namespace {

// The first Ctrl-C asks the loop to save a checkpoint after the current step and stop; a
// second one exits at once.
void on_interrupt(int) {
  kiln::train::request_stop();
  std::signal(SIGINT, SIG_DFL);
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::tools::report_errors("kiln-train", 2, [&] {
    try {
      const kiln::train::Config config = kiln::train::parse_args(argc, argv);
      std::signal(SIGINT, on_interrupt);
      const kiln::train::Result result = kiln::train::run(config, std::cout);
      return result.interrupted ? 130 : 0;
    } catch (const kiln::train::HelpRequested& help) {
      std::cout << help.text;
      return 0;
    }
  });
}
