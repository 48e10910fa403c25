"""Pure helpers of the NVML backend (no library needed)."""

from __future__ import annotations


from gputop.backends.nvml import (
    ERR_DRIVER_NOT_LOADED, ERR_LIBRARY_NOT_FOUND, ERR_NO_PERMISSION, error_name,
    merge_process_lists, reset_error_kind, unavailable_reason,
)


def test_merge_compute_graphics_and_both():
    merged = merge_process_lists([(10, 100), (30, 300)], [(20, 200), (30, 300)])
    assert merged == {10: ("C", 100), 20: ("G", 200), 30: ("C+G", 300)}


def test_merge_c_plus_g_keeps_the_larger_memory_not_the_sum():
    assert merge_process_lists([(7, 100)], [(7, 150)]) == {7: ("C+G", 150)}


def test_merge_mig_instances_in_one_list_add_up():
    assert merge_process_lists([(5, 100), (5, 50)], []) == {5: ("C", 150)}


def test_merge_unknown_memory_stays_unknown():
    assert merge_process_lists([(1, None)], []) == {1: ("C", None)}
    assert merge_process_lists([(1, None), (1, 5)], []) == {1: ("C", None)}  # a sum with an unknown part
    assert merge_process_lists([(1, None)], [(1, 64)]) == {1: ("C+G", 64)}  # the other list knows it
    assert merge_process_lists([], [(2, None)]) == {2: ("G", None)}


def test_merge_empty():
    assert merge_process_lists([], []) == {}


def test_unavailable_reasons_say_what_to_do():
    assert unavailable_reason(ERR_LIBRARY_NOT_FOUND).startswith("nvml: libnvidia-ml.so.1 not found")
    assert unavailable_reason(ERR_DRIVER_NOT_LOADED).startswith("nvml: driver not loaded")
    assert unavailable_reason(ERR_NO_PERMISSION).startswith("nvml: no permission")
    assert unavailable_reason(999, "Unknown Error") == "nvml: cannot initialise NVML: Unknown Error"


def test_error_names():
    assert error_name(3) == "NotSupported"
    assert error_name(13) == "FunctionNotFound"
    assert error_name(15) == "GpuIsLost"
    assert error_name(4242) == "Error4242"
    assert error_name(None) == "Error"


def test_reset_error_kinds_from_nvidia_smi_text():
    assert reset_error_kind("GPU 00000000:17:00.0: Reset not supported.") == "unsupported"
    assert reset_error_kind("Unable to reset GPU 00000000:17:00.0: Insufficient Permissions") == "permission"
    assert reset_error_kind("GPU 00000000:17:00.0 is currently in use by another process.") == "busy"
    assert reset_error_kind("Unable to reset this GPU because it's being used by some other process "
                            "(e.g. CUDA application, graphics application like X server)") == "busy"
    assert reset_error_kind("Unknown Error") == "failed"


