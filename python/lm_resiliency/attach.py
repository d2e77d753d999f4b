"""One attachment per training job: the only wrapper around the optimizer's step.

The replay harness, the fault-injection session, the hang monitor and checkpoint
certification all act at the optimizer boundary. Each used to wrap ``optimizer.step``
itself, so closing them out of construction order put a closed consumer's wrapper back or
silently removed another's. Now the first of them (or ``attach(model, optimizer)``) makes
the job's ``Attachment``; it wraps the step once and runs *listeners* in phases:

- ``before_step()`` in ascending ``order`` (smaller runs first: the outermost);
- the optimizer's own step;
- ``after_step()`` in descending order (the outermost last); ``step_skipped()`` instead
  when the adapter says the framework skipped the update (``step_applied()`` false, a
  loss-scale overflow: not a completed iteration); or, when the step or a
  ``before_step`` raised, ``step_failed(error)`` for each listener whose ``before_step`` ran
  (or raised), in the same descending order, and the error is re-raised. An
  ``after_step`` that raises does not stop the others; the first such error is raised
  once all ran.

A listener is registered with ``add_listener(listener, order)`` and removed by the handle
that returns (``handle.remove()``, as torch's ``register_step_post_hook``), in any order;
the step wrapper goes away with the last listener. Listeners are objects with any of the
three methods. The orders of the built-in consumers are the constants below: the fault
session is outermost (its effects are armed around everything else), the replay harness
innermost (its snapshot is taken just before the update and its check runs right after).

Loads of model or optimizer state (``load_state_dict``) are watched the same way:
``on_load(callback)`` gets ``"model"`` or ``"optimizer"``. So are the framework's internal
collectives (the adapter's communication facet, installed once however many consumers
watch them): ``on_internal_collective(around, on_done)``, used by hang detection (which
publishes them) and by collective timing (which times a sample of them).

Not thread-safe: attach, step and close from the training thread (a listener may take its
own lock).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Optional

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import FrameworkAdapter, select_adapter
from lm_resiliency.handle import Handle

__all__ = ["Attachment", "Handle", "attach", "CERTIFICATION", "FAULT_INJECTION", "HANG_DETECTION", "REPLAY"]

# Listener orders of the built-in consumers (smaller: earlier before the step, later after it).
FAULT_INJECTION = 100
HANG_DETECTION = 200
CERTIFICATION = 250  # after the replay harness at the same boundary: the check comes first
REPLAY = 300

_attachments: "weakref.WeakValueDictionary[int, Attachment]" = weakref.WeakValueDictionary()


class Attachment:
    """The job's optimizer-boundary dispatcher. Get it with :func:`attach`."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self.adapter: FrameworkAdapter = select_adapter(model, optimizer)
        self._listeners: list[tuple[int, int, Any]] = []  # (order, serial, listener), sorted
        self._load_callbacks: list[tuple[int, Callable[[str], None]]] = []
        self._serial = 0
        self._current: tuple[list, list, list, list] = ([], [], [], [])
        self._unwrap: Optional[Handle] = None
        self._unwatch: Optional[Handle] = None
        self._comm_subscribers: list[tuple[int, Callable[..., Any], Optional[Callable[[], None]]]] = []
        self._comm_install: Optional[tuple[Optional[Handle], Optional[str]]] = None

    # --- listeners -----------------------------------------------------------------------

    def add_listener(self, listener: Any, order: int) -> Handle:
        """Runs `listener`'s before_step / after_step / step_failed at every step, at
        `order` (ties: registration order)."""
        if not any(callable(getattr(listener, m, None)) for m in ("before_step", "after_step", "step_failed",
                                                                  "step_skipped")):
            raise InvalidArgumentError(f"{listener!r} has none of before_step, after_step, step_failed")
        self._serial += 1
        entry = (int(order), self._serial, listener)
        self._listeners.append(entry)
        self._listeners.sort(key=lambda e: (e[0], e[1]))
        self._current = self._phases()
        if self._unwrap is None:
            self._unwrap = self.adapter.wrap_step(self._wrap)
        return Handle(lambda: self._drop_listener(entry))

    def on_load(self, callback: Callable[[str], None]) -> Handle:
        """`callback("model")` or `callback("optimizer")` after each load_state_dict of
        the model or the optimizer (also when it failed part-way)."""
        self._serial += 1
        entry = (self._serial, callback)
        self._load_callbacks.append(entry)
        if self._unwatch is None:
            self._unwatch = self.adapter.watch_loads(lambda: self._loaded("model"), lambda: self._loaded("optimizer"))
        return Handle(lambda: self._drop_load(entry))

    def on_internal_collective(self, around: Callable[..., Any],
                               on_done: Optional[Callable[[], None]] = None) -> tuple[Handle, Optional[str]]:
        """Watches the framework's internal collectives (see the adapter's
        ``publish_internal_collectives``): ``around(name, group, tensor, collective)`` for
        each; `collective` is a callable that runs it (``around`` must call it once and
        return its result) or None for one the framework runs out of reach (``around`` is
        then told before it starts). ``on_done()`` when the framework's communication of the
        step is over. Subscribers nest in subscription order (the first is outermost); each
        must contain its own failures. Returns (the handle, why the framework's collectives
        cannot be watched, or None)."""
        self._serial += 1
        entry = (self._serial, around, on_done)
        self._comm_subscribers.append(entry)
        if self._comm_install is None:
            self._comm_install = self.adapter.publish_internal_collectives(self._run_internal, self._internal_done)
        return Handle(lambda: self._drop_comm(entry)), self._comm_install[1]

    def _run_internal(self, name: str, group: Any, tensor: Any, collective: Optional[Callable[[], Any]]) -> Any:
        subscribers = [around for _, around, _ in self._comm_subscribers]
        if collective is None:
            for around in subscribers:
                around(name, group, tensor, None)
            return None
        run = collective
        for around in reversed(subscribers):
            run = functools.partial(around, name, group, tensor, run)
        return run()

    def _internal_done(self) -> None:
        for _, _, on_done in list(self._comm_subscribers):
            if on_done is not None:
                on_done()

    def _drop_comm(self, entry: tuple) -> None:
        if entry in self._comm_subscribers:
            self._comm_subscribers.remove(entry)
        self._release_if_idle()

    @property
    def listeners(self) -> list[Any]:
        return [listener for _, _, listener in self._listeners]

    def _drop_listener(self, entry: tuple) -> None:
        if entry in self._listeners:
            self._listeners.remove(entry)
            self._current = self._phases()
        self._release_if_idle()

    def _drop_load(self, entry: tuple) -> None:
        if entry in self._load_callbacks:
            self._load_callbacks.remove(entry)
        self._release_if_idle()

    def _release_if_idle(self) -> None:
        if not self._listeners and self._unwrap is not None:
            self._unwrap.remove()
            self._unwrap = None
        if not self._load_callbacks and self._unwatch is not None:
            self._unwatch.remove()
            self._unwatch = None
        if not self._comm_subscribers and self._comm_install is not None:
            handle = self._comm_install[0]
            self._comm_install = None
            if handle is not None:
                handle.remove()
        if (self._unwrap is None and self._unwatch is None and self._comm_install is None
                and _attachments.get(_key(self.model, self.optimizer)) is self):
            del _attachments[_key(self.model, self.optimizer)]

    def _loaded(self, kind: str) -> None:
        for _, callback in list(self._load_callbacks):
            callback(kind)

    # --- the step --------------------------------------------------------------------------

    def _phases(self) -> tuple[list, list, list]:
        """(before_step methods in order, after_step methods in reverse order, listeners),
        recomputed only when listeners change: a step does no lookups."""
        listeners = [listener for _, _, listener in self._listeners]
        before = [getattr(x, "before_step", None) for x in listeners]
        after = [f for f in (getattr(x, "after_step", None) for x in reversed(listeners)) if f is not None]
        skipped = [f for f in (getattr(x, "step_skipped", None) for x in reversed(listeners)) if f is not None]
        return before, after, skipped, listeners

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            before, after, skipped, listeners = self._current
            entered = 0
            try:
                for fn in before:
                    entered += 1
                    if fn is not None:
                        fn()
                result = original(*args, **kwargs)
            except BaseException as error:
                for listener in reversed(listeners[:entered]):
                    failed = getattr(listener, "step_failed", None)
                    if failed is not None:
                        failed(error)
                raise
            raised: Optional[BaseException] = None
            for fn in (after if self.adapter.step_applied() else skipped):
                try:
                    fn()
                except BaseException as e:  # noqa: BLE001 - the outer listeners still see the step
                    raised = raised or e
            if raised is not None:
                raise raised
            return result

        return step


def attach(model: Any, optimizer: Any = None) -> Attachment:
    """The attachment of this (model, optimizer): the existing one, or a new one. Every
    consumer of the same optimizer shares it; a different model with the same optimizer
    is refused. `optimizer` None: the framework's object holds it (a DeepSpeed engine)."""
    existing = _attachments.get(_key(model, optimizer))
    if existing is not None and existing.optimizer is optimizer:
        if existing.model is not model:
            raise InvalidArgumentError("this optimizer is already attached with another model: pass the same model "
                                       "object to every LM Resiliency consumer of the job")
        return existing
    attachment = Attachment(model, optimizer)
    _attachments[_key(model, optimizer)] = attachment
    return attachment


def _key(model: Any, optimizer: Any) -> int:
    return id(optimizer if optimizer is not None else model)
