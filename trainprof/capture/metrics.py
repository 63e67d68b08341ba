"""TorchMetrics: `trainprof/metric.*` ranges and metric metadata, only if the script uses it.

torchmetrics is never imported by trainprof: an import hook patches it right after the script
imports it (or at once if something already had). Metric.update/compute are wrapped per
instance by torchmetrics itself (`_wrap_update`/`_wrap_compute` in Metric.__init__), so those
two factories are patched; forward is a plain method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainprof.capture.metadata import MetaCollector
from trainprof.capture.patching import Patches
from trainprof.capture.probes import probe
from trainprof.capture.state import S
from trainprof.capture.userframe import UserCode

MODULE = "torchmetrics"


class TorchMetricsSupport:
    def __init__(self, patches: Patches, collector: MetaCollector, user: UserCode) -> None:
        self.patches = patches
        self.collector = collector
        self.user = user
        self.patched = False

    def install(self) -> None:
        self.patches.after_import(MODULE, self._patch)

    def _patch(self, module: ModuleType) -> None:
        metric_cls = getattr(module, "Metric", None)
        if self.patched or metric_cls is None:
            return
        self.patched = True
        # Metric calls are not the model's forward (they get their own ranges).
        collection = getattr(module, "MetricCollection", None)
        S.metric_types = (metric_cls,) + ((collection,) if isinstance(collection, type) else ())
        self.patches.on_restore(lambda: setattr(S, "metric_types", ()))
        collector, user, patches = self.collector, self.user, self.patches

        def wrap_init(orig: Callable[..., None]) -> Callable[..., None]:
            @functools.wraps(orig)
            def __init__(metric: Any, *args: Any, **kwargs: Any) -> None:
                orig(metric, *args, **kwargs)
                if S.enabled:
                    collector.add_metric(metric, user.caller())

            return __init__

        def wrap_update_factory(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def _wrap_update(metric: Any, update: Callable[..., Any]) -> Callable[..., Any]:
                inner = orig(metric, update)
                seen = False

                @functools.wraps(inner)
                def first_update_then_probe(*args: Any, **kwargs: Any) -> Any:
                    nonlocal seen
                    if not seen:  # nan_strategy/device are set after Metric.__init__ returns
                        seen = True
                        collector.refresh_metric(metric)
                    return probed(*args, **kwargs)

                probed = probe("trainprof/metric.update", inner)
                return first_update_then_probe

            return _wrap_update

        def wrap_compute_factory(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def _wrap_compute(metric: Any, compute: Callable[..., Any]) -> Callable[..., Any]:
                return probe("trainprof/metric.compute", orig(metric, compute))

            return _wrap_compute

        patches.wrap(metric_cls, "__init__", wrap_init)
        patches.wrap(metric_cls, "_wrap_update", wrap_update_factory)
        patches.wrap(metric_cls, "_wrap_compute", wrap_compute_factory)
        patches.wrap(metric_cls, "forward", lambda orig: probe("trainprof/metric.forward", orig))
