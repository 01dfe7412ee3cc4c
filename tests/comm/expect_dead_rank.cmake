# Runs 3 ranks where rank 1 exits abruptly after the first barrier while the
# others wait in an all-reduce; passes if mpirun stops all of them quickly
# with a non-zero status and names the dead rank.
string(TIMESTAMP start "%s")
execute_process(
  COMMAND ${MPIRUN} --oversubscribe --allow-run-as-root --mca btl self,vader -np 3 ${CHECK} die
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 40)
string(TIMESTAMP end "%s")
math(EXPR elapsed "${end} - ${start}")
message(STATUS "mpirun exit: ${rc} after ${elapsed}s\n${out}\n${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "mpirun succeeded although rank 1 died")
endif()
if(elapsed GREATER 20)
  message(FATAL_ERROR "the surviving ranks took ${elapsed}s to stop")
endif()
# mpirun's own report names the first failed process: "Process name: [[job,1],1]".
if(NOT "${out}${err}" MATCHES "Process name: \\[\\[[0-9]+,[0-9]+\\],1\\]")
  message(FATAL_ERROR "mpirun's report does not name rank 1")
endif()
