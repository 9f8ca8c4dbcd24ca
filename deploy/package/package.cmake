# Install layout and the Debian package (docs/operations.md, "Install (Debian package, systemd)").
#
#   cmake --install build [--prefix /usr]       sluiced, sluicectl in <prefix>/bin; config and rules
#                                               in /etc/sluice; sluiced.service in
#                                               /lib/systemd/system; docs in <prefix>/share/doc/sluice
#   cpack --config build/CPackConfig.cmake      sluice_<version>_amd64.deb (prefix /usr)
#
# The package creates the system user `sluice` and /var/lib/sluice (deploy/package/postinst); the
# unit runs sluiced as that user with /var/lib/sluice as its state directory.
include(GNUInstallDirs)

set(SLUICE_INSTALL_CONFDIR "/etc/sluice" CACHE PATH "where the config and rules files are installed")
set(SLUICE_INSTALL_UNITDIR "/lib/systemd/system" CACHE PATH "where sluiced.service is installed")
set(SLUICE_PACKAGE_MAINTAINER "Sluice maintainers <root@localhost>" CACHE STRING
    "the Debian package's Maintainer field")

install(TARGETS sluiced sluicectl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# /etc/sluice/sluiced.yaml: the example config with the installed paths. Its first start creates
# the database in /var/lib/sluice (init_data), which systemd's StateDirectory= leaves empty.
file(READ ${PROJECT_SOURCE_DIR}/deploy/sluiced.example.yaml example)
string(REGEX REPLACE "\n# rules: [^\n]*" "\nrules: ${SLUICE_INSTALL_CONFDIR}/rules.yaml   # reload: systemctl reload sluiced"
       installed "${example}")
string(REGEX REPLACE "\ndata_dir: [^\n]*"
       "\ndata_dir: /var/lib/sluice  # sluiced.service's StateDirectory=\ninit_data: true            # the first start creates the database there"
       installed "${installed}")
set(installed "# Installed by the sluice package: rules and data_dir name the installed paths.\n${installed}")
foreach(expect "\nrules: ${SLUICE_INSTALL_CONFDIR}/rules.yaml" "\ndata_dir: /var/lib/sluice")
  string(FIND "${installed}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "deploy/sluiced.example.yaml changed: cannot derive the installed config"
                        " (no line \"${expect}\" after the substitutions in ${CMAKE_CURRENT_LIST_FILE})")
  endif()
endforeach()
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/packaging/sluiced.yaml CONTENT "${installed}" @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/packaging/sluiced.yaml DESTINATION ${SLUICE_INSTALL_CONFDIR})
install(FILES ${PROJECT_SOURCE_DIR}/deploy/rules.example.yaml DESTINATION ${SLUICE_INSTALL_CONFDIR}
        RENAME rules.yaml)

# The unit names /usr/bin/sluiced and /etc/sluice/: rewritten at install time for the prefix in
# force then (cmake --install --prefix, or /usr under cpack).
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/sluiced.service\" unit)
  string(REPLACE \"/usr/bin/sluiced\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/sluiced\"
         unit \"\${unit}\")
  string(REPLACE \"/etc/sluice/\" \"${SLUICE_INSTALL_CONFDIR}/\" unit \"\${unit}\")
  set(dest \"\$ENV{DESTDIR}${SLUICE_INSTALL_UNITDIR}/sluiced.service\")
  message(STATUS \"Installing: \${dest}\")
  file(WRITE \"\${dest}\" \"\${unit}\")
")

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB sluice_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${sluice_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME sluice)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "peer-to-peer rate-limit daemon")
set(CPACK_PACKAGE_DESCRIPTION
    "Sluice tells a service in microseconds whether a request may go ahead, over UDP, TCP, HTTP\nand Envoy's rate limit service (gRPC). Nodes shard keys by consistent hashing and gossip\ncounter deltas to each other: no central store.")
# Absolute destinations (/etc/sluice, /lib/systemd/system) land in the package, not on this machine.
# With DESTDIR, the prefix cpack installs to is CPACK_INSTALL_PREFIX.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # sluice_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${SLUICE_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Library dependencies come from dpkg-shlibdeps (dpkg-dev); adduser runs in the maintainer scripts.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libsluice.so.0 (the C API, lib/client) is in the package: a shlibs file for packages linking it,
# and the ldconfig trigger (deploy/package/triggers) so the loader's cache knows it after dpkg -i.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# Both /etc/sluice files are conffiles: an upgrade keeps local changes (dpkg asks), remove keeps
# them, purge deletes them.
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/packaging/conffiles
     CONTENT "${SLUICE_INSTALL_CONFDIR}/sluiced.yaml\n${SLUICE_INSTALL_CONFDIR}/rules.yaml\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_BINARY_DIR}/packaging/conffiles ${CMAKE_CURRENT_LIST_DIR}/postinst
    ${CMAKE_CURRENT_LIST_DIR}/prerm ${CMAKE_CURRENT_LIST_DIR}/postrm
    ${CMAKE_CURRENT_LIST_DIR}/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
