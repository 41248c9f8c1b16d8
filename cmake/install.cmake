# Install rules, the exported targets (ampactor::...), the package config and version files, and
# a Debian package of the same tree (cpack -G DEB: libampactor-dev).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ampactor_libs ampactor_core ampactor_kernels ampactor_optim ampactor_scaler ampactor_checkpoint
    ampactor_keeper ampactor_protocol ampactor_messages ampactor_actors ampactor_trace)
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

install(TARGETS ${_ampactor_libs} ampactor_all EXPORT ampactorTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Each library's include/ holds its public headers and nothing else (internal headers live beside
# the sources), so installing those folders installs exactly the public surface.
set(_ampactor_include_dirs core kernels optim scaler checkpoint keeper messages actors trace .)
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
  install(TARGETS ampactor-replay ampactor-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_ampactor_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ampactor)
install(EXPORT ampactorTargets NAMESPACE ampactor:: DESTINATION ${_ampactor_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ampactorConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ampactorConfig.cmake
                              INSTALL_DESTINATION ${_ampactor_cmake_dir})
# 0.x: a minor version may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ampactorConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ampactorConfig.cmake
              ${PROJECT_BINARY_DIR}/ampactorConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
        DESTINATION ${_ampactor_cmake_dir})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libampactor-dev)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ampactor maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Dynamic loss scaling for LibTorch on CAF actors (GradScaler, AsyncOptimizer)")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libtorch-dev, libcaf-dev (>= 0.17), nlohmann-json3-dev")
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
include(CPack)
