"""The wheel platform of this interpreter (linux_x86_64 or linux_aarch64): what pip's tags select here. From the
interpreter, never from /proc/cpuinfo, which an emulated userland (QEMU user mode) reads from the host."""

from __future__ import annotations

import platform


def wheel_platform() -> str:
    """linux_aarch64 on an aarch64 (arm64) interpreter, else linux_x86_64."""
    return "linux_aarch64" if platform.machine().lower() in ("aarch64", "arm64") else "linux_x86_64"
