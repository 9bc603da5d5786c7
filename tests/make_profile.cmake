# Builds the tinyllama codec profile the tests share (TOOL --out OUT), once: a build
# that has one keeps it. Without the model data nothing is built and the tests that
# need the profile skip.
if(EXISTS "${OUT}")
  message(STATUS "codec profile present: ${OUT}")
  return()
endif()
if(NOT EXISTS "$ENV{KVSTREAM_TINYLLAMA}/stories260K.bin")
  message(STATUS "no tinyllama data at '$ENV{KVSTREAM_TINYLLAMA}': no profile; the tests that need it skip")
  return()
endif()
execute_process(COMMAND "${TOOL}" --out "${OUT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvstream-profile failed (${rc})")
endif()
