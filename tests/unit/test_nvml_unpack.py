"""The NVML backend reads its process and utilisation arrays with struct.iter_unpack: the formats must
give exactly the fields ctypes reads from the same memory (nvml.h layouts)."""

from __future__ import annotations

from gputop.backends.nvml import (
    NOT_AVAILABLE, _ProcessInfoV1, _ProcessInfoV2, _ProcessUtilizationSample, _unpack,
)


def test_process_infos_unpack_to_pid_and_memory_for_both_layouts():
    for struct_type in (_ProcessInfoV1, _ProcessInfoV2):
        buf = (struct_type * 6)()
        for i, (pid, mem) in enumerate([(4242, 3 << 30), (7, NOT_AVAILABLE), (4294967295, 0)]):
            buf[i].pid, buf[i].usedGpuMemory = pid, mem
            if struct_type is _ProcessInfoV2:
                buf[i].gpuInstanceId, buf[i].computeInstanceId = 0xFFFFFFFF, 5  # never read as memory
        entries, raw = _unpack(buf, 3)
        assert entries == [(e.pid, e.usedGpuMemory) for e in buf[:3]]
        assert entries == [(4242, 3 << 30), (7, NOT_AVAILABLE), (4294967295, 0)]
        assert len(raw) == 3 * len(bytes(struct_type()))
    assert _unpack((_ProcessInfoV2 * 4)(), 0) == ([], b"")


def test_utilisation_samples_unpack_to_pid_time_and_sm():
    buf = (_ProcessUtilizationSample * 4)()
    for i, (pid, ts, sm) in enumerate([(10, 1_000_000_123, 70), (11, 2**63 + 5, 0)]):
        buf[i].pid, buf[i].timeStamp, buf[i].smUtil = pid, ts, sm
        buf[i].memUtil, buf[i].encUtil, buf[i].decUtil = 99, 98, 97  # not read
    entries, _ = _unpack(buf, 2)
    assert entries == [(10, 1_000_000_123, 70), (11, 2**63 + 5, 0)]
