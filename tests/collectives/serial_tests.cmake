# Included by CTest after the discovered tests of collectives_test: the matrices of 5 to 8
# rank threads (and 8 rank processes) each keep every core of a 2-core machine busy, and
# two of them beside each other spend their time taking turns (the ring and direct
# all-reduce of 8 threads ran 5 to 8 times slower beside another than alone).
# PROCESSORS 2 makes `ctest -j2` run each alone; on more cores they still overlap.
foreach(t IN LISTS collectives_test_TESTS)
  if(t MATCHES "/(threads_[5-8]|processes_8)_")
    set_tests_properties("${t}" PROPERTIES PROCESSORS 2)
  endif()
endforeach()
