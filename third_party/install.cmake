# Two CMake packages, both used as find_package(kiln) then kiln::kiln: the installed one
# (`cmake --install build --prefix DIR`, then CMAKE_PREFIX_PATH=DIR) and the build tree
# itself (kiln_DIR=build), whose kilnTargets.cmake names the build's library and the
# source tree's headers.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS kiln EXPORT kilnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/kiln.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
foreach(layer core core/ops kernels autograd models optim data dist compiler compiler/ir compiler/passes compiler/codegen)
  file(GLOB headers ${PROJECT_SOURCE_DIR}/${layer}/*.h)
  install(FILES ${headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${layer})
endforeach()
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
export(EXPORT kilnTargets NAMESPACE kiln:: FILE ${PROJECT_BINARY_DIR}/kilnTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/third_party/kilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
