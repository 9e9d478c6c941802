# The minimal C plugin of docs/plugin.md (examples/plugin/minimal_plugin.c), included by this folder's
# CMakeLists.txt: built as strict C99 with warnings as errors, so the build proves the ABI header is C99.
# The project enables C at the top for it.
add_library(dflash_minimal_plugin MODULE ${CMAKE_CURRENT_LIST_DIR}/minimal_plugin.c)
set_target_properties(dflash_minimal_plugin PROPERTIES
  C_STANDARD 99
  C_STANDARD_REQUIRED ON
  C_EXTENSIONS OFF
  C_VISIBILITY_PRESET hidden)
target_include_directories(dflash_minimal_plugin PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_compile_options(dflash_minimal_plugin PRIVATE
  $<$<C_COMPILER_ID:GNU,Clang>:-Wall -Wextra -pedantic -Werror>)
