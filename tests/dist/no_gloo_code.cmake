# cmake -DNM=<nm> -DOBJECTS_DIR=<the library's object directory> -P no_gloo_code.cmake
#
# Against PyTorch 2.x's wheel, c10d's ProcessGroupGloo.hpp is compiled with Debian's Gloo headers
# (a 2022 snapshot), while the Gloo inside libtorch_cpu.so is a late-2025 one whose classes differ
# (gloo::rendezvous::Store gained a base class and virtual functions, gloo::Context's destructor
# is no longer virtual, UnboundBuffer gained virtual functions). That is safe only while the
# library compiles no code that depends on Gloo's layouts: no Gloo function called or emitted, no
# vtable or typeinfo of a Gloo class, and nothing of ProcessGroupGloo's inline GlooStore. This
# fails, naming the symbols, when an object file has any.
file(GLOB_RECURSE objects "${OBJECTS_DIR}/*.o")
if(NOT objects)
  message(FATAL_ERROR "no object files under ${OBJECTS_DIR}")
endif()
set(found "")
foreach(object ${objects})
  execute_process(COMMAND "${NM}" -C "${object}" OUTPUT_VARIABLE symbols RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} -C ${object} failed (exit ${status})")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  foreach(line ${lines})
    # "<address> <kind> <name>" or "<kind> <name>" for undefined symbols: the name after the kind letter.
    string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] " "" name "${line}")
    if(name MATCHES "^gloo::|^(vtable|typeinfo|typeinfo name|VTT|construction vtable) for gloo::|GlooStore|ProcessGroupGloo::(AsyncWork|SendWork|RecvWork)")
      string(APPEND found "\n  ${object}: ${name}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "code compiled against Gloo's headers, whose layouts need not match the Gloo in "
                      "LibTorch (see src/dist/process_group.cpp):${found}")
endif()
list(LENGTH objects count)
message(STATUS "no Gloo code in ${count} object files")
