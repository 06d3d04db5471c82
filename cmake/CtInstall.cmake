# Installs the libraries, public headers, a CMake package and a pkg-config
# file. Private headers (*_impl.h) stay in the source tree.
install(TARGETS ct ct_static ct_deps EXPORT ctTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(dir IN LISTS CT_PUBLIC_INCLUDE_DIRS)
  install(DIRECTORY ${dir}/ct DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
endforeach()
install(EXPORT ctTargets NAMESPACE ct:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ct)
configure_package_config_file(cmake/ctConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/ctConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ct)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ctConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ctConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ctConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ct)

# ct.pc names the prefix, which `cmake --install --prefix` may change after
# configuring; so the prefix is filled in when installing.
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(CT_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(CT_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
set(CT_PC_PREFIX "@CT_PC_PREFIX@")
configure_file(cmake/ct.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ct.pc.in @ONLY)
install(CODE "
  set(CT_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_CURRENT_BINARY_DIR}/ct.pc.in\" \"${CMAKE_CURRENT_BINARY_DIR}/ct.pc\" @ONLY)
")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ct.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
