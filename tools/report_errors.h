#pragma once
// The programs' last line of defence: whatever a program's body throws becomes one line on
// stderr and an exit status, never an abort (an uncaught exception) or a crash report.
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <system_error>

#include "core/error.h"

namespace kiln::tools {

// Writes "<program>: <message>" on stderr, or the message alone where it already starts
// with the program's name ("kiln-bench train: ...").
inline void report_error(std::string_view program, std::string_view message) {
  const bool named = message.starts_with(program) && message.size() > program.size() &&
                     (message[program.size()] == ':' || message[program.size()] == ' ');
  if (named) std::cerr << message << '\n';
  else std::cerr << program << ": " << message << '\n';
}

// Runs `body` and returns its exit status; an exception is reported (report_error) with
// what it was and gives `status`.
template <class Body>
int report_errors(std::string_view program, int status, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    report_error(program, e.what());
  } catch (const std::bad_alloc&) {
    report_error(program, "out of memory (std::bad_alloc): a smaller batch, image size or model may fit");
  } catch (const std::filesystem::filesystem_error& e) {
    report_error(program, std::string("file system: ") + e.what());
  } catch (const std::system_error& e) {
    report_error(program, std::string("system: ") + e.what());
  } catch (const std::exception& e) {
    report_error(program, std::string("unexpected error: ") + e.what());
  } catch (...) {
    report_error(program, "unexpected error of an unknown type");
  }
  return status;
}

}  // namespace kiln::tools
