"""Type stubs of the `nrt` package (run models on the software NeuronCore of nrt-rs)."""

import concurrent.futures
import os
from typing import (
    Any,
    ContextManager,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

_Path = Union[str, "os.PathLike[str]"]
_Feed = Union[np.ndarray, "Tensor", Any]

__version__: str
#: Every NRT_STATUS: {"NRT_SUCCESS": 0, "NRT_INVALID": 2, "NRT_TIMEOUT": 5, ...}.
STATUS: Dict[str, int]
#: The numpy dtype of bf16 tensors: ml_dtypes.bfloat16 if installed, else uint16.
bfloat16: np.dtype

class NrtError(RuntimeError):
    """A runtime call failed; str(e) is "NRT_<NAME>: message"."""

    #: The NRT_STATUS code (e.g. 5 for NRT_TIMEOUT, 101 for NRT_EXEC_UNIT_UNRECOVERABLE).
    status: int
    #: The status's name, e.g. "NRT_TIMEOUT".
    status_name: str
    #: The message without the status prefix; it names the tensor or model at fault.
    message: str

class ModelNotFoundError(FileNotFoundError, NrtError):
    """A model path that does not exist: a FileNotFoundError (errno ENOENT, .filename) and an
    NrtError (status NRT_INVALID)."""

class TensorInfo:
    """One input or output of a model."""

    @property
    def name(self) -> str:
        """The tensor's name."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape."""
    @property
    def dtype(self) -> np.dtype:
        """The numpy element type (bf16: see `bfloat16`)."""
    @property
    def size(self) -> int:
        """Size in bytes."""

class Tensor:
    """A tensor in the device memory of one logical core; pass it in an input dict to skip
    the host-to-device copy."""

    @staticmethod
    def from_numpy(array: Any, core: int = 0, name: Optional[str] = None) -> "Tensor":
        """Copies `array` into a new device tensor. Only the device's element types (float32,
        float16, bfloat16, float64, int8-64, uint8-64, bool; native byte order): any other
        dtype (object, str, bytes, void, datetime, complex) raises NrtError naming it."""
    def numpy(self) -> np.ndarray:
        """Copies the tensor into a new numpy array."""
    def write(self, array: Any) -> None:
        """Overwrites the tensor with `array` (same shape and dtype)."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape."""
    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype."""
    @property
    def core(self) -> int:
        """The logical core it lives on."""
    @property
    def size(self) -> int:
        """Size in bytes."""
    @property
    def name(self) -> str:
        """The name given at creation."""

class Future(concurrent.futures.Future):  # type: ignore[type-arg]
    """A concurrent.futures.Future of a model's output dict that asyncio can also await."""

    def __await__(self) -> Generator[Any, None, Dict[str, np.ndarray]]: ...
    def result(self, timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """The output dict; raises the run's NrtError, or TimeoutError after `timeout` s."""

class Model:
    """A model loaded on the process-global runtime. Dropping the last reference unloads
    it. In a child made by os.fork() it raises NrtError (NRT_INVALID_HANDLE): load it again
    there."""

    @staticmethod
    def load(
        path: Union[_Path, bytes],
        core: int = 0,
        cores: int = 1,
        *,
        input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
        timeout: Optional[float] = None,
    ) -> "Model":
        """Loads a model on logical core `core` (among this process's visible cores). An
        .onnx file is compiled for `cores` cores (symbolic dims bound by `input_shapes`);
        any other path, or bytes, is a compiled model (NCM) that must span `cores` cores.
        `timeout` is the per-execution timeout in seconds (default NEURON_RT_EXEC_TIMEOUT
        or 30)."""
    @property
    def inputs(self) -> List[TensorInfo]:
        """The inputs, in the model's order."""
    @property
    def outputs(self) -> List[TensorInfo]:
        """The outputs, in the model's order."""
    @property
    def name(self) -> str:
        """The model's name."""
    @property
    def core(self) -> int:
        """The logical core it is loaded on."""
    @property
    def cores(self) -> int:
        """How many cores it spans."""
    @property
    def loaded(self) -> bool:
        """False after unload() or nrt.close()."""
    def __call__(self, inputs: Mapping[str, _Feed]) -> Dict[str, np.ndarray]:
        """Runs the model (same as run())."""
    def run(self, inputs: Mapping[str, _Feed]) -> Dict[str, np.ndarray]:
        """Runs the model: every input by name (numpy array or nrt.Tensor) in, a dict of new
        numpy arrays out. Releases the GIL while it runs. Raises NrtError."""
    def submit(self, inputs: Mapping[str, _Feed]) -> Future:
        """Runs the model on a worker thread; returns a Future (awaitable in asyncio). The
        input arrays are copied when submit() is called."""
    def reset(self) -> None:
        """Resets the model's core after a fatal device error; NrtError once unloaded."""
    def unload(self) -> None:
        """Unloads the model; later calls raise NrtError (NRT_INVALID)."""
    def benchmark(
        self,
        warmup: int = 100,
        iterations: int = 1000,
        mode: str = "host",
        inputs: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """Times executions: mode="host" full m(inputs) calls, mode="device" executions on
        device tensors. Returns {mean, min, max, std, p50, p99, per_iteration, unit="us",
        mode, iterations}, times in microseconds."""

class NodeArg:
    """An input or output of an InferenceSession (ONNX Runtime's NodeArg)."""

    name: str
    shape: List[Union[int, str, None]]
    type: str
    def __init__(self, name: str, shape: List[Union[int, str, None]], type: str) -> None: ...

class InferenceSession:
    """ONNX Runtime's convention: InferenceSession(path).run(None, feeds) -> list."""

    def __init__(
        self,
        path: _Path,
        sess_options: Any = None,
        providers: Any = None,
        *,
        core: int = 0,
        cores: int = 1,
        max_compiled_shapes: int = 16,
    ) -> None:
        """A model with symbolic input dims is compiled per input shape; at most
        `max_compiled_shapes` stay loaded (least recently used dropped first)."""
    def get_inputs(self) -> List[NodeArg]:
        """The graph's inputs (initializers excluded)."""
    def get_outputs(self) -> List[NodeArg]:
        """The graph's outputs."""
    def get_providers(self) -> List[str]:
        """The one execution provider."""
    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> List[np.ndarray]:
        """The outputs (all, in model order, when output_names is None)."""
    @property
    def compiled_shapes(self) -> List[Tuple[Tuple[int, ...], ...]]:
        """The input-shape keys compiled so far."""

def configure(
    visible_cores: Union[str, int, Sequence[int], None] = None,
    *,
    num_cores: Optional[int] = None,
    logical_nc_config: Optional[int] = None,
    log_level: Optional[str] = None,
    interruptible: Optional[bool] = None,
) -> None:
    """Sets how the process-global runtime starts (before first use; overrides the
    NEURON_RT_* environment). log_level ("ERROR", "WARN", "INFO", "DEBUG", "TRACE", "OFF")
    and interruptible (default True: main-thread calls wake every 50 ms for signals, so
    Ctrl-C interrupts a hung call; False: the sync surface, some tens of us faster) may be
    changed at any time."""

def close() -> None:
    """Closes the runtime; earlier models/tensors raise NRT_CLOSED; the next use starts a
    new runtime."""

def visible_cores() -> List[List[int]]:
    """The physical cores of each logical core of the runtime."""

def compile(
    path: Union[_Path, bytes],
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
    cores: int = 1,
) -> bytes:
    """Compiles an ONNX model (path or bytes); returns the compiled model (NCM bytes)."""

def profile(path: _Path) -> ContextManager[None]:
    """Writes the executions inside the `with` block as Chrome trace JSON to `path`."""

def inject_faults(spec: str) -> None:
    """Arms a fault plan (NRT_SIM_FAULTS syntax, e.g. "fatal", "hang@engine=act") on this
    process's software NeuronCore only; `core=` counts among this process's logical cores,
    no `exec` means the next execution."""

def clear_faults() -> None:
    """Removes every planned fault of this process's device."""

def reset(core: int = 0) -> None:
    """Resets logical core `core` after a fatal device error."""
