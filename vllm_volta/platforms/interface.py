"""DeviceCapability, the Platform base class and PlatformEnum.

A Platform answers every "what can this hardware do" question (dtype, attention backend,
custom all-reduce) from one number, its compute capability, so that overriding that number
(VLLM_VOLTA_DEVICE_CAPABILITY) changes every decision at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from vllm_volta import envs
from vllm_volta.logger import info_once, init_logger
from vllm_volta.platforms.attention_selector import select_attn_backend
from vllm_volta.platforms.dtype import dtype_name, parse_dtype

logger = init_logger(__name__)

DEFAULT_BLOCK_SIZE = 16


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    CPU = enum.auto()


@dataclass(frozen=True, order=True)
class DeviceCapability:
    """A CUDA compute capability; orders like (major, minor). 7.0 = V100, 7.5 = T4, 9.0 = H100."""

    major: int
    minor: int

    def __post_init__(self) -> None:
        for field, value in (("major", self.major), ("minor", self.minor)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 99:
                raise ValueError(f"DeviceCapability.{field} must be an integer in [0, 99]; got {value!r}")
        if self.minor > 9:
            raise ValueError(f"DeviceCapability.minor must be in [0, 9]; got {self.minor}")

    def to_int(self) -> int:
        """7.0 -> 70, 7.5 -> 75, 9.0 -> 90."""
        return self.major * 10 + self.minor

    def as_version_str(self) -> str:
        """7.0 -> "7.0"."""
        return f"{self.major}.{self.minor}"

    @classmethod
    def from_int(cls, value: int) -> DeviceCapability:
        """70 -> DeviceCapability(7, 0)."""
        return cls(value // 10, value % 10)


def resolve_capability_override() -> DeviceCapability | None:
    """The capability forced by VLLM_VOLTA_DEVICE_CAPABILITY, or None (ValueError if malformed)."""
    parsed = envs.VLLM_VOLTA_DEVICE_CAPABILITY
    return None if parsed is None else DeviceCapability(*parsed)


def _capability_int(capability: tuple[int, int] | int | DeviceCapability) -> int:
    if isinstance(capability, DeviceCapability):
        return capability.to_int()
    if isinstance(capability, tuple) and len(capability) == 2:
        return DeviceCapability(*capability).to_int()
    if isinstance(capability, int) and not isinstance(capability, bool) and capability >= 0:
        return capability
    raise ValueError(
        f"capability must be an int such as 70, a (major, minor) tuple or a DeviceCapability; "
        f"got {capability!r}"
    )


class Platform:
    """Base class: what a device type can do. Subclasses set the class attributes below."""

    _enum: PlatformEnum
    device_type: str  # torch device type: "cuda", "cpu"
    device_name: str  # platform name for logs

    # ---- identity -------------------------------------------------------------------------
    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ---- capability -----------------------------------------------------------------------
    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        """The compute capability the decisions use (None where the notion does not apply)."""
        return None

    def get_device_name(self, device_id: int = 0) -> str:
        raise NotImplementedError

    def get_device_total_memory(self, device_id: int = 0) -> int:
        """Bytes of memory the device has."""
        raise NotImplementedError

    def has_device_capability(
        self, capability: tuple[int, int] | int | DeviceCapability, device_id: int = 0
    ) -> bool:
        """True when the device's capability is at least ``capability`` (70, (7, 0), ...)."""
        current = self.get_device_capability(device_id)
        return current is not None and current.to_int() >= _capability_int(capability)

    def is_device_capability(
        self, capability: tuple[int, int] | int | DeviceCapability, device_id: int = 0
    ) -> bool:
        """True when the device's capability is exactly ``capability``."""
        current = self.get_device_capability(device_id)
        return current is not None and current.to_int() == _capability_int(capability)

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        """True when the device's major version matches: family 70 holds 7.0 and 7.5."""
        current = self.get_device_capability(device_id)
        return current is not None and current.major * 10 == _capability_int(capability) // 10 * 10

    # ---- dtype ----------------------------------------------------------------------------
    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        """Activation/weight dtypes this device runs, preferred first."""
        raise NotImplementedError

    def _auto_dtype(self, config_dtype: torch.dtype) -> torch.dtype:
        """What dtype="auto" means here, before the bfloat16 rule is applied."""
        raise NotImplementedError

    def resolve_dtype(
        self, requested: str | torch.dtype, config_dtype: torch.dtype | None
    ) -> torch.dtype:
        """The dtype the model runs in, from the user's ``dtype`` and the checkpoint's dtype.

        Where bfloat16 is unsupported (below SM80) a bfloat16 checkpoint is cast to float16 with
        one log line; an explicit bfloat16 request is a ValueError naming ``--dtype half``.
        """
        explicit = parse_dtype(requested)
        # HF configs without torch_dtype mean float32 weights.
        if explicit is not None:
            target = explicit
        else:
            target = self._auto_dtype(config_dtype if config_dtype is not None else torch.float32)
        supported = self.supported_dtypes
        if target == torch.bfloat16 and torch.bfloat16 not in supported:
            where = self._where()
            if explicit == torch.bfloat16:
                raise ValueError(
                    f"dtype='bfloat16' is not supported on {where} (bfloat16 needs compute "
                    f"capability 8.0 or newer); use --dtype half (float16) instead"
                )
            info_once(logger, "bfloat16 is not supported on %s; casting to float16", where)
            target = torch.float16
        if target not in supported:
            allowed = ", ".join(dtype_name(d) for d in supported)
            raise ValueError(
                f"dtype={dtype_name(target)!r} is not supported on {self._where()}; "
                f"supported: {allowed}"
            )
        return target

    def _where(self) -> str:
        capability = self.get_device_capability()
        if capability is None:
            return f"the {self.device_name} platform"
        return f"compute capability {capability.as_version_str()}"

    # ---- attention ------------------------------------------------------------------------
    def get_attn_backend_priority(self) -> list[str]:
        """Backend names to try, best first, for this device."""
        raise NotImplementedError

    def get_attn_backend(self, *, dtype: torch.dtype, head_size: int) -> type:
        """The first backend (or the one forced by VLLM_VOLTA_ATTENTION_BACKEND) that can run.

        Raises ValueError listing every candidate and its reasons when none can.
        """
        return select_attn_backend(
            self.get_attn_backend_priority(),
            capability=self.get_device_capability(),
            dtype=dtype,
            head_size=head_size,
            device_type=self.device_type,
            forced=envs.VLLM_VOLTA_ATTENTION_BACKEND,
        )

    # ---- distributed ----------------------------------------------------------------------
    @property
    def supports_custom_all_reduce(self) -> bool:
        """Whether tensor parallelism may use a custom (P2P) all-reduce instead of NCCL's."""
        return False

    # ---- engine config --------------------------------------------------------------------
    def check_and_update_config(self, vllm_config: Any) -> None:
        """Adjust an engine config to this platform, in place (contract in ARCHITECTURE.md).

        - ``cache_config.block_size`` None -> 16.
        - ``parallel_config.disable_custom_all_reduce`` forced True where unsupported.
        Sub-configs or fields that do not exist are left alone.
        """
        cache_config = getattr(vllm_config, "cache_config", None)
        if cache_config is not None and getattr(cache_config, "block_size", 0) is None:
            cache_config.block_size = DEFAULT_BLOCK_SIZE
        parallel_config = getattr(vllm_config, "parallel_config", None)
        if (
            parallel_config is not None
            and hasattr(parallel_config, "disable_custom_all_reduce")
            and not self.supports_custom_all_reduce
            and not parallel_config.disable_custom_all_reduce
        ):
            info_once(logger, "Custom all-reduce is not supported on %s; disabling it", self._where())
            parallel_config.disable_custom_all_reduce = True
