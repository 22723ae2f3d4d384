"""nrt — run models on the software NeuronCore of nrt-rs from Python.

Two conventions users know:

* the Neuron runtime's own (``nrt.Model.load(path, core=0)``, call with a dict of numpy
  arrays, get a dict back, ``benchmark()``, device tensors with ``nrt.Tensor``), and
* ONNX Runtime's (``nrt.InferenceSession(path).run(None, feeds)``).

One process-global runtime serves every model. It starts on first use from the environment
(``NEURON_RT_VISIBLE_CORES``, ``NEURON_RT_NUM_CORES``, ``NEURON_LOGICAL_NC_CONFIG``,
``NEURON_RT_LOG_LEVEL``, ``NRT_SIM_FAULTS``); :func:`configure` called before first use
overrides those. Every runtime failure raises :class:`NrtError` with ``.status`` (the
``NRT_STATUS`` code) and ``.status_name``.

Data path: a numpy input that is C-contiguous and of the model's dtype is read in place (this
layer copies nothing; the runtime stages it into device memory, as for any host tensor).
Anything else (a strided view, Fortran order, a list) costs one copy into a contiguous array
first; a wrong dtype raises. Outputs are new numpy arrays that the runtime writes directly.
The GIL is released for the whole execution, so threads run models concurrently.

bfloat16 tensors are ``ml_dtypes.bfloat16`` arrays when the ``ml_dtypes`` package is
installed, otherwise ``uint16`` arrays holding the raw bf16 bits (inputs accept both).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _nrt
from ._nrt import (
    Model,
    NrtError,
    Tensor,
    TensorInfo,
    clear_faults,
    close,
    compile,
    configure,
    inject_faults,
    reset,
    visible_cores,
)



class ModelNotFoundError(FileNotFoundError, NrtError):
    """A model path that does not exist (``Model.load``, ``compile``, ``InferenceSession``):
    a :class:`FileNotFoundError` (``.errno`` ENOENT, ``.filename``) that is also an
    :class:`NrtError` (``.status`` NRT_INVALID), so either ``except`` catches it. Printed as
    every NrtError is: ``NRT_INVALID: <message naming the path>``."""

    def __str__(self) -> str:
        return f"{getattr(self, 'status_name', 'NRT_INVALID')}: {getattr(self, 'message', super().__str__())}"


__all__ = [
    "Model",
    "Tensor",
    "TensorInfo",
    "NrtError",
    "ModelNotFoundError",
    "Future",
    "InferenceSession",
    "NodeArg",
    "configure",
    "close",
    "compile",
    "profile",
    "inject_faults",
    "clear_faults",
    "reset",
    "visible_cores",
    "STATUS",
    "bfloat16",
]

__version__ = "0.1.0"

#: Every ``NRT_STATUS``: ``{"NRT_SUCCESS": 0, "NRT_INVALID": 2, "NRT_TIMEOUT": 5, ...}``.
STATUS: Dict[str, int] = dict(_nrt._statuses())

try:  # bf16 as a real numpy dtype when ml_dtypes is installed
    import ml_dtypes as _ml_dtypes

    #: The numpy dtype bf16 tensors use: ``ml_dtypes.bfloat16`` if installed, else ``uint16``.
    bfloat16: np.dtype = np.dtype(_ml_dtypes.bfloat16)
    _nrt._set_bf16_dtype(bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    bfloat16 = np.dtype(np.uint16)


#===----------------------------------------------------------------------------------===#
# Futures: Model.submit
#===----------------------------------------------------------------------------------===#


class Future(concurrent.futures.Future):
    """The result of :meth:`Model.submit`: a :class:`concurrent.futures.Future` (``result(
    timeout)``, ``done()``, ``add_done_callback``...) that can also be awaited in asyncio."""

    def __await__(self):  # type: ignore[override]
        return asyncio.wrap_future(self).__await__()


_executor_lock = threading.Lock()
_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
#: The process the pool's threads run in (a fork child has none of them).
_executor_pid = os.getpid()


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: the child has none of the parent's
    threads — neither the submit pool's nor the runtime's — and a lock a parent thread held
    stays locked. Forget the pool (the next ``submit`` makes a new one) and the parent's
    runtime (the next use starts this process's own; the parent's models and tensors raise
    NrtError here, saying so)."""
    global _executor, _executor_lock, _executor_pid
    _executor_lock = threading.Lock()
    _executor = None  # its threads are the parent's; never shut down (that would join them)
    _executor_pid = os.getpid()
    _nrt._set_main_thread(threading.get_ident())  # the forking thread is the child's main
    try:
        _nrt._after_fork_child()
    except NrtError:
        pass  # raised again, with its reason, on the child's first use of nrt


# Signal handlers (Ctrl-C) run on the main thread: its model calls wait interruptibly.
_nrt._set_main_thread(threading.main_thread().ident or 0)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    if _executor_pid != os.getpid():  # a fork that did not run the at-fork hook
        _after_fork_in_child()
    with _executor_lock:
        if _executor is None:
            workers = int(os.environ.get("NRT_PY_SUBMIT_THREADS", "4"))
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, workers), thread_name_prefix="nrt-submit"
            )
        return _executor


def _snapshot(model: Model, inputs: Mapping[str, Any]) -> Dict[str, Any]:
    """The feeds of a :meth:`Model.submit`, copied now: a numpy array as a new C-contiguous
    array, anything array-like (a list) converted to the input's dtype. ``nrt.Tensor``
    inputs are device tensors and are not copied. A value that cannot be converted is left
    as it is, so that the run reports it (through the future) as ``Model.run`` would."""
    dtypes = {i.name: i.dtype for i in model.inputs}
    feeds: Dict[str, Any] = {}
    for k, v in inputs.items():
        if isinstance(v, Tensor):
            feeds[k] = v
        elif isinstance(v, np.ndarray):
            feeds[k] = np.array(v, copy=True, order="C")
        elif k in dtypes:
            try:
                feeds[k] = np.array(v, dtype=dtypes[k], copy=True, order="C")
            except Exception:  # reported by the run, through the future
                feeds[k] = v
        else:
            feeds[k] = v
    return feeds


def _submit(self: Model, inputs: Mapping[str, Any]) -> Future:
    """Runs the model on a worker thread (the GIL is released while it executes) and returns
    a :class:`Future` of the output dict; ``await`` it in asyncio or call ``.result(timeout)``.
    Errors (NrtError) are raised by ``result()`` / ``await``. The input arrays are copied
    when ``submit`` is called, so changing them afterwards does not change the result
    (``nrt.Tensor`` inputs are device tensors: writing one before the run changes it)."""
    fut = Future()
    feeds = _snapshot(self, inputs)

    def work() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(self.run(feeds))
        except BaseException as e:  # delivered to the waiter
            fut.set_exception(e)

    _pool().submit(work)
    return fut


Model.submit = _submit  # type: ignore[attr-defined]


#===----------------------------------------------------------------------------------===#
# Profiling
#===----------------------------------------------------------------------------------===#


@contextlib.contextmanager
def profile(path: Union[str, "os.PathLike[str]"]) -> Iterator[None]:
    """Records every execution inside the ``with`` block (the five host stages validate,
    bind, stage, doorbell, harvest of each) and writes them to ``path`` as Chrome trace-event
    JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
    _nrt._trace_start()
    try:
        yield
    finally:
        _nrt._trace_stop(os.fspath(path))


#===----------------------------------------------------------------------------------===#
# The ONNX Runtime convention
#===----------------------------------------------------------------------------------===#

# ONNX TensorProto.DataType -> ONNX Runtime's type string and numpy dtype.
_ONNX_TYPES: Dict[int, Tuple[str, Any]] = {
    1: ("tensor(float)", np.float32),
    2: ("tensor(uint8)", np.uint8),
    3: ("tensor(int8)", np.int8),
    4: ("tensor(uint16)", np.uint16),
    5: ("tensor(int16)", np.int16),
    6: ("tensor(int32)", np.int32),
    7: ("tensor(int64)", np.int64),
    9: ("tensor(bool)", np.bool_),
    10: ("tensor(float16)", np.float16),
    11: ("tensor(double)", np.float64),
    12: ("tensor(uint32)", np.uint32),
    13: ("tensor(uint64)", np.uint64),
    16: ("tensor(bfloat16)", None),
}


class NodeArg:
    """An input or output of an :class:`InferenceSession` (ONNX Runtime's ``NodeArg``):
    ``name``, ``shape`` (ints, with a str or None for symbolic dimensions) and ``type``
    (``'tensor(float)'``...)."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, shape: List[Union[int, str, None]], type: str) -> None:
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class InferenceSession:
    """ONNX Runtime's convention over the software NeuronCore.

    ``InferenceSession(path).run(None, {"x": x})`` returns the outputs as a list in the
    model's order. A model whose inputs have ``-1``/symbolic dimensions is compiled once per
    distinct set of input shapes, on first use of that shape, and the compiled model cached:
    at most ``max_compiled_shapes`` of them (default 16), the least recently used one dropped
    (and so unloaded, once no call is using it) to make room for a new shape.
    ``providers``/``sess_options`` are accepted for compatibility and ignored.

    In a child made by ``os.fork()`` the session loads its models again on first use (those
    of the parent belong to the parent's runtime)."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        sess_options: Any = None,
        providers: Any = None,
        *,
        core: int = 0,
        cores: int = 1,
        max_compiled_shapes: int = 16,
    ) -> None:
        if not isinstance(max_compiled_shapes, int) or max_compiled_shapes < 1:
            raise _nrt_error(2, f"max_compiled_shapes={max_compiled_shapes!r} (an int >= 1)")
        self._path = os.fspath(path)
        self._core = core
        self._cores = cores
        self._max_shapes = max_compiled_shapes
        self._pid = os.getpid()
        ins, outs = _nrt._onnx_signature(self._path)
        self._inputs = [NodeArg(n, list(d), _ONNX_TYPES.get(t, (f"tensor({t})", None))[0]) for n, d, t in ins]
        self._outputs = [NodeArg(n, list(d), _ONNX_TYPES.get(t, (f"tensor({t})", None))[0]) for n, d, t in outs]
        self._static = all(isinstance(d, int) and d >= 0 for i in self._inputs for d in i.shape)
        self._models: "collections.OrderedDict[Tuple[Tuple[int, ...], ...], Model]" = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        if self._static:
            self._models[()] = Model.load(self._path, core=core, cores=cores)

    def get_inputs(self) -> List[NodeArg]:
        """The graph's inputs (initializers excluded), in order."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The graph's outputs, in order."""
        return list(self._outputs)

    def get_providers(self) -> List[str]:
        """The one execution provider: the software NeuronCore."""
        return ["NrtSoftNeuronCoreExecutionProvider"]

    def _forked(self) -> None:
        """In a fork child: drop the parent's models (they belong to its runtime) and a lock
        a parent thread may have held at fork; the models load again on first use."""
        self._lock = threading.Lock()
        self._models = collections.OrderedDict()
        self._pid = os.getpid()

    def _model_for(self, feeds: Mapping[str, Any]) -> Model:
        if self._pid != os.getpid():
            self._forked()
        if self._static:
            with self._lock:
                m = self._models.get(())
                if m is None:
                    m = Model.load(self._path, core=self._core, cores=self._cores)
                    self._models[()] = m
                return m
        shapes: Dict[str, List[int]] = {}
        for i in self._inputs:
            if i.name not in feeds:
                raise _nrt_error(2, f"input '{i.name}' of model {self._path} is missing")
            shapes[i.name] = list(np.shape(feeds[i.name]))
        key = tuple(tuple(shapes[i.name]) for i in self._inputs)
        with self._lock:
            m = self._models.get(key)
            if m is None:
                m = Model.load(self._path, core=self._core, cores=self._cores, input_shapes=shapes)
                self._models[key] = m
                while len(self._models) > self._max_shapes:
                    # Unloaded when the last reference goes: at once, or when a call still
                    # running on it in another thread returns.
                    self._models.popitem(last=False)
            else:
                self._models.move_to_end(key)
            return m

    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> List[np.ndarray]:
        """Runs the model; returns the outputs named by ``output_names`` (all, in the model's
        order, when None) as a list of numpy arrays."""
        out = self._model_for(input_feed)(dict(input_feed))
        names = [o.name for o in self._outputs] if output_names is None else list(output_names)
        missing = [n for n in names if n not in out]
        if missing:
            raise _nrt_error(2, f"model {self._path} has no output named {missing[0]!r}")
        return [out[n] for n in names]

    @property
    def compiled_shapes(self) -> List[Tuple[Tuple[int, ...], ...]]:
        """The input-shape keys compiled so far (one entry for a static model)."""
        return list(self._models)


def _nrt_error(status: int, message: str) -> NrtError:
    """An :class:`NrtError` built in Python, with ``status``/``status_name``/``message``."""
    name = next((k for k, v in STATUS.items() if v == status), f"NRT_STATUS_{status}")
    e = NrtError(f"{name}: {message}")
    e.status = status  # type: ignore[attr-defined]
    e.status_name = name  # type: ignore[attr-defined]
    e.message = message  # type: ignore[attr-defined]
    return e
