# Install rules, the exported targets (ampactor::...), the package config and version files, a
# pkg-config file, and a Debian package of the same tree (cpack -G DEB: libampactor-dev).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ampactor_libs ampactor_core ampactor_kernels ampactor_optim ampactor_scaler ampactor_checkpoint
    ampactor_keeper ampactor_protocol ampactor_messages ampactor_actors ampactor_pipeline ampactor_run
    ampactor_trace ampactor_metrics)
if(AMPACTOR_TENSORBOARD)
  list(APPEND _ampactor_libs ampactor_metrics_tensorboard)
endif()
if(AMPACTOR_PROMETHEUS)
  list(APPEND _ampactor_libs ampactor_metrics_prometheus)
endif()
if(AMPACTOR_TORCH_CUDA)
  list(APPEND _ampactor_libs ampactor_kernels_cuda)
endif()
if(AMPACTOR_DIST)
  list(APPEND _ampactor_libs ampactor_distributed ampactor_dist)
endif()
foreach(_lib IN LISTS _ampactor_libs)
  string(REPLACE "ampactor_" "" _name ${_lib})
  set_target_properties(${_lib} PROPERTIES EXPORT_NAME ${_name})
endforeach()

set_target_properties(ampactor_all PROPERTIES EXPORT_NAME ampactor)

# Each library's include/ holds its public headers and nothing else (internal headers live beside
# the sources), so installing those folders installs exactly the public surface.
set(_ampactor_include_dirs core kernels optim scaler checkpoint keeper messages actors pipeline run trace
    metrics .)
if(AMPACTOR_DIST)
  list(APPEND _ampactor_include_dirs distributed)
endif()
foreach(_dir IN LISTS _ampactor_include_dirs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/include/ampactor
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/include/ampactor/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ampactor)
if(TARGET ampactor-replay)
  install(TARGETS ampactor-replay ampactor-launch ampactor-ckpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# The libraries, their CMake package and their .pc go in two layouts. Component lib, what a plain
# `cmake --install --prefix ...` installs: CMAKE_INSTALL_LIBDIR, which GNUInstallDirs makes
# lib/<multiarch> only for a configure-time prefix of /usr (lib for any other). Component deb,
# left out of a plain install, is the .deb's: CPack installs to /usr but keeps the configure-time
# libdir, so the .deb has rules of its own with Debian's multiarch libdir. The headers and
# programs above (the default component) are in both.
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(_ampactor_deb_libdir lib/${CMAKE_LIBRARY_ARCHITECTURE})
else()
  set(_ampactor_deb_libdir lib)
endif()
set(_ampactor_lib_libdir ${CMAKE_INSTALL_LIBDIR})
set(_ampactor_lib_export ampactorTargets)
set(_ampactor_lib_config ${PROJECT_BINARY_DIR})
set(_ampactor_lib_exclude "")
set(_ampactor_deb_export ampactorDebTargets)
set(_ampactor_deb_config ${PROJECT_BINARY_DIR}/packaging/deb)
set(_ampactor_deb_exclude EXCLUDE_FROM_ALL)

# 0.x: a minor version may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ampactorConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)

# The .pc's libraries in link order: static libraries name each library before those it needs,
# so the targets' own dependencies are walked depth first and the order reversed.
function(_ampactor_link_order target)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL INTERFACE_LIBRARY)
    get_target_property(_deps ${target} INTERFACE_LINK_LIBRARIES)
  else()
    get_target_property(_deps ${target} LINK_LIBRARIES)
  endif()
  foreach(_dep IN LISTS _deps)
    if(TARGET ${_dep})
      get_target_property(_aliased ${_dep} ALIASED_TARGET)
      if(_aliased)
        set(_dep ${_aliased})
      endif()
    endif()
    get_property(_done GLOBAL PROPERTY _ampactor_link_order)
    if(_dep IN_LIST _ampactor_libs AND NOT _dep IN_LIST _done)
      _ampactor_link_order(${_dep})
    endif()
  endforeach()
  if(NOT _type STREQUAL INTERFACE_LIBRARY)
    set_property(GLOBAL APPEND PROPERTY _ampactor_link_order ${target})
  endif()
endfunction()
set_property(GLOBAL PROPERTY _ampactor_link_order "")
_ampactor_link_order(ampactor_all)
get_property(AMPACTOR_PC_LIBS GLOBAL PROPERTY _ampactor_link_order)
list(REVERSE AMPACTOR_PC_LIBS)
list(TRANSFORM AMPACTOR_PC_LIBS REPLACE "^ampactor_" "-lampactor_")
list(JOIN AMPACTOR_PC_LIBS " " AMPACTOR_PC_LIBS)
set(AMPACTOR_PC_CFLAGS "")
if(AMPACTOR_TORCH_CUDA)
  set(AMPACTOR_PC_CFLAGS " -DAMPACTOR_TORCH_CUDA")  # kernels' public definition
endif()

foreach(_layout IN ITEMS lib deb)
  set(_libdir ${_ampactor_${_layout}_libdir})
  set(_exclude ${_ampactor_${_layout}_exclude})
  set(_cmake_dir ${_libdir}/cmake/ampactor)
  install(TARGETS ${_ampactor_libs} ampactor_all EXPORT ${_ampactor_${_layout}_export}
          ARCHIVE DESTINATION ${_libdir} COMPONENT ${_layout} ${_exclude}
          LIBRARY DESTINATION ${_libdir} COMPONENT ${_layout} ${_exclude}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT ${_ampactor_${_layout}_export} FILE ampactorTargets.cmake NAMESPACE ampactor::
          DESTINATION ${_cmake_dir} COMPONENT ${_layout} ${_exclude})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ampactorConfig.cmake.in
                                ${_ampactor_${_layout}_config}/ampactorConfig.cmake
                                INSTALL_DESTINATION ${_cmake_dir})
  install(FILES ${_ampactor_${_layout}_config}/ampactorConfig.cmake
                ${PROJECT_BINARY_DIR}/ampactorConfigVersion.cmake
                ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
                ${PROJECT_SOURCE_DIR}/cmake/TorchWheelRpath.cmake
          DESTINATION ${_cmake_dir} COMPONENT ${_layout} ${_exclude})
  # The .deb's .pc says prefix=/usr, as Debian's do; the install tree's finds its prefix from
  # where it lies, so it is right for any --prefix.
  if(_layout STREQUAL deb)
    set(AMPACTOR_PC_PREFIX /usr)
  else()
    string(REGEX REPLACE "[^/]+" ".." AMPACTOR_PC_PREFIX "${_libdir}/pkgconfig")
    set(AMPACTOR_PC_PREFIX "\${pcfiledir}/${AMPACTOR_PC_PREFIX}")
  endif()
  set(AMPACTOR_PC_LIBDIR ${_libdir})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ampactor.pc.in
                 ${PROJECT_BINARY_DIR}/packaging/${_layout}/ampactor.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/packaging/${_layout}/ampactor.pc
          DESTINATION ${_libdir}/pkgconfig COMPONENT ${_layout} ${_exclude})
endforeach()

# What Debian puts beside every package: /usr/share/doc/<package>/copyright (machine-readable) and
# the changelog, compressed reproducibly (-n: no name or time stamp) when the package is made.
set(_ampactor_deb_doc share/doc/libampactor-dev)
install(CODE "execute_process(COMMAND gzip -9n -c \"${PROJECT_SOURCE_DIR}/CHANGELOG.md\"
                              OUTPUT_FILE \"${PROJECT_BINARY_DIR}/packaging/deb/changelog.gz\"
                              RESULT_VARIABLE _rc)
              if(_rc)
                message(FATAL_ERROR \"gzip CHANGELOG.md: \${_rc}\")
              endif()"
        COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/copyright
              ${PROJECT_BINARY_DIR}/packaging/deb/changelog.gz
        DESTINATION ${_ampactor_deb_doc} COMPONENT deb EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libampactor-dev)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ampactor maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Dynamic loss scaling for LibTorch on CAF actors (GradScaler, AsyncOptimizer)")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libtorch-dev, libcaf-dev (>= 0.17), nlohmann-json3-dev")
# The metrics sinks that were built: the package's CMake config finds their libraries.
if(AMPACTOR_TENSORBOARD)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libprotobuf-dev, libboost-dev")
endif()
if(AMPACTOR_PROMETHEUS)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", prometheus-cpp-dev")
endif()
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# One package of the headers and programs (the default component) and the .deb's layout.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL ${CMAKE_INSTALL_DEFAULT_COMPONENT_NAME} deb)
include(CPack)
