# What the Python package (python/, KVSTREAM_WITH_PYTHON) needs: a Python 3
# interpreter with the headers for extension modules, and pybind11. Included from the
# root CMakeLists before the optional parts are reported; sets _python_found and
# _python_reason (why not, for the report).
#
# Debian's /usr/bin/python3 is preferred when it exists (and Python3_EXECUTABLE is not
# given): a pyenv or venv interpreter earlier on PATH lacks Debian's python3-numpy,
# python3-torch and python3-pytest, which the tests and examples use.
set(_python_found OFF)
set(_python_reason "")
if(NOT KVSTREAM_WITH_PYTHON STREQUAL "OFF")
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    # The interpreter is not instrumented: it refuses to load an ASan/TSan extension
    # unless the sanitizer runtime is preloaded.
    set(_python_reason "this is a sanitizer build (-fsanitize in CMAKE_CXX_FLAGS); python cannot load instrumented extensions")
  else()
    if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python 3 interpreter the kvstream package is built for")
    endif()
    find_package(Python3 3.8 COMPONENTS Interpreter Development.Module QUIET)
    if(NOT Python3_FOUND)
      set(_python_reason "Python 3 with its development headers (python3-dev) was not found")
    else()
      # Python3_FOUND makes pybind11 use FindPython's targets (the interpreter above).
      find_package(pybind11 2.6 CONFIG QUIET)
      if(pybind11_FOUND)
        set(_python_found ON)
      else()
        set(_python_reason "pybind11 (pybind11-dev) was not found for ${Python3_EXECUTABLE}")
      endif()
    endif()
  endif()
endif()
