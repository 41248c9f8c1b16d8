# The documentation's checks (included from the top CMakeLists.txt under AMPACTOR_TESTS); each
# reads only the source tree and needs nothing built.
# Every cpp block of README.md and doc/**/*.md is an excerpt of examples/, which package.examples
# builds and runs.
add_test(NAME docs.blocks
         COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/check-doc-blocks.sh ${PROJECT_SOURCE_DIR})
# doc/reference/cmake-options.md names every AMPACTOR_* cache entry and every program of bench/,
# tools/, demo/ and fuzz/, and nothing else in its tables.
add_test(NAME docs.cmake_options
         COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/check-options.sh ${PROJECT_SOURCE_DIR})
# Every relative link of the markdown resolves inside the repository, headings included.
add_test(NAME docs.links
         COMMAND sh ${PROJECT_SOURCE_DIR}/scripts/check-links.sh ${PROJECT_SOURCE_DIR})
