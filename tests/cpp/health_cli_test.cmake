# lmr health probe|watch against the fake NVML (FAKE_NVML), and without any NVML.
function(run_lmr out_rc out_stdout out_stderr config)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LMR_NVML_LIBRARY=${FAKE_NVML} "LMR_FAKE_NVML=${config}"
                          ${LMR} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_stdout} "${out}" PARENT_SCOPE)
  set(${out_stderr} "${err}" PARENT_SCOPE)
endfunction()

# A healthy pair of GPUs: exit 0, both listed, readings present.
run_lmr(rc out err "devices=2" health probe --format json)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "probe of healthy GPUs: expected exit 0, got ${rc}: ${out} ${err}")
endif()
string(JSON n LENGTH "${out}" devices)
string(JSON temp GET "${out}" devices 1 readings temperature_c)
string(JSON shutdown GET "${out}" devices 1 readings temperature_shutdown_c)
string(JSON uuid GET "${out}" devices 1 device uuid)
if(NOT n EQUAL 2 OR NOT temp EQUAL 40 OR NOT shutdown EQUAL 92 OR NOT uuid MATCHES "^GPU-")
  message(FATAL_ERROR "probe JSON: expected 2 devices with temperature 40/92 and a UUID: ${out}")
endif()

# Remap failure on GPU 1, remapped rows unsupported on GPU 0: exit 1, both said.
run_lmr(rc out err "devices=2;1.remap_failure=1;0.fail.remapped_rows=3" health probe --format json)
string(JSON severity GET "${out}" devices 1 events 0 severity)
string(JSON metric GET "${out}" devices 1 events 0 metric)
string(JSON unsupported GET "${out}" devices 0 unsupported)
if(NOT rc EQUAL 1 OR NOT severity STREQUAL "fatal" OR NOT metric STREQUAL "remap_failure"
   OR NOT unsupported MATCHES "remap_failure")
  message(FATAL_ERROR "probe with a failed remap: expected exit 1, a fatal remap_failure and unsupported remap metrics: ${rc} ${out}")
endif()

# Text format names the GPU and what is unsupported.
run_lmr(rc out err "devices=1;0.fail.ecc=3" health probe --device 0)
if(NOT rc EQUAL 0 OR NOT out MATCHES "gpu 0" OR NOT out MATCHES "unsupported: ecc_uncorrectable_volatile")
  message(FATAL_ERROR "probe text: ${rc} ${out} ${err}")
endif()

# watch: a fatal XID queued for GPU 0 arrives as an event line; exit 1.
run_lmr(rc out err "devices=1;0.xid=79" health watch --interval 0.05 --count 3 --format json)
if(NOT rc EQUAL 1 OR NOT out MATCHES "\"metric\":\"xid\"" OR NOT out MATCHES "\"severity\":\"fatal\"")
  message(FATAL_ERROR "watch: expected a fatal xid event and exit 1, got ${rc}: ${out} ${err}")
endif()
run_lmr(rc out err "devices=1" health watch --interval 0.05 --count 2)
if(NOT rc EQUAL 0 OR NOT "${out}" STREQUAL "")
  message(FATAL_ERROR "watch of a healthy GPU: expected no events and exit 0, got ${rc}: ${out} ${err}")
endif()

# Usage errors exit 2 and name the option; a device NVML lacks is named.
run_lmr(rc out err "devices=1" health watch --interval 0)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--interval")
  message(FATAL_ERROR "watch --interval 0: expected exit 2 naming --interval, got ${rc}: ${err}")
endif()
run_lmr(rc out err "devices=1" health probe --device 3)
if(NOT rc EQUAL 2 OR NOT err MATCHES "index 3 does not exist")
  message(FATAL_ERROR "probe --device 3: expected exit 2 naming the index, got ${rc}: ${err}")
endif()

# No NVML at all: a clear error, exit 4.
execute_process(COMMAND ${CMAKE_COMMAND} -E env LMR_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 ${LMR} health probe
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 4 OR NOT err MATCHES "cannot load NVML")
  message(FATAL_ERROR "probe without NVML: expected exit 4 and 'cannot load NVML', got ${rc}: ${err}")
endif()
