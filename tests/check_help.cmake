# Runs `BIN --help` and fails unless it exits 0 and prints CLI11's usage line.
# Used by the help_<binary> tests (tests/CMakeLists.txt):
#   cmake -DBIN=<path> -P check_help.cmake
# A crash, an uncaught exception or a binary that ignores --help (runs, or parses
# "--help" as a number) fails here.
if(NOT BIN)
  message(FATAL_ERROR "check_help.cmake: give -DBIN=<executable>")
endif()
execute_process(COMMAND "${BIN}" --help RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "${BIN} --help: exit status '${rc}' (expected 0)\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT out MATCHES "Usage: " OR NOT out MATCHES "--help")
  message(FATAL_ERROR "${BIN} --help exited 0 but printed no usage with --help on stdout\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "${BIN} --help: ok")
