# bench.table: bench/README.md's goals table must be what bench/make_table.py computes from the
# data files under bench/results/data/ (python3 bench/make_table.py rewrites it). Without python3
# the test is reported as skipped, not passed: its command then exits 77.
find_program(AMPACTOR_PYTHON3 NAMES python3)
if(AMPACTOR_PYTHON3)
  add_test(NAME bench.table
           COMMAND ${AMPACTOR_PYTHON3} ${PROJECT_SOURCE_DIR}/bench/make_table.py --check
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
else()
  add_test(NAME bench.table
           COMMAND sh -c "echo 'bench.table: python3 not found, skipped'; exit 77"
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
endif()
set_tests_properties(bench.table PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)
