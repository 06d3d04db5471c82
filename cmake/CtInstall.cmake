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
# Libs.private: every library ct_deps links, as linker flags, so that a
# program linking libct.a gets all of them: the CUDA runtime, cuBLAS, NCCL
# and MPI as well, when this build has them. An absolute path becomes
# -L<dir> -l<name>, a bare name -l<name>.
get_target_property(_ct_dep_libs ct_deps INTERFACE_LINK_LIBRARIES)
set(_ct_pc_libs "")
foreach(lib IN LISTS _ct_dep_libs)
  if(lib MATCHES "^::@")
    continue() # CMake's marker of the directory that linked what follows
  elseif(lib STREQUAL "Threads::Threads")
    list(APPEND _ct_pc_libs -pthread)
  elseif(IS_ABSOLUTE "${lib}")
    get_filename_component(dir "${lib}" DIRECTORY)
    get_filename_component(name "${lib}" NAME_WE)
    string(REGEX REPLACE "^lib" "" name "${name}")
    list(APPEND _ct_pc_libs "-L${dir}" "-l${name}")
  elseif(TARGET "${lib}")
    message(FATAL_ERROR "ct.pc: ct_deps links the target ${lib}, which has no linker flags to "
                        "write into Libs.private; link its libraries by path")
  else()
    list(APPEND _ct_pc_libs "-l${lib}")
  endif()
endforeach()
list(REMOVE_DUPLICATES _ct_pc_libs)
list(JOIN _ct_pc_libs " " CT_PC_LIBS_PRIVATE)
set(CT_PC_PREFIX "@CT_PC_PREFIX@")
configure_file(cmake/ct.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ct.pc.in @ONLY)
install(CODE "
  set(CT_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_CURRENT_BINARY_DIR}/ct.pc.in\" \"${CMAKE_CURRENT_BINARY_DIR}/ct.pc\" @ONLY)
")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ct.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
