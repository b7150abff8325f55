"""The Prometheus text exposition (format 0.0.4) of a metrics registry, as
``prometheus_client.generate_latest`` writes it, at a fraction of its CPU.

``generate_latest`` checks and escapes every label name of every sample again; a scheduler
of 1,000 jobs exposes about 8,000 samples, so a scrape cost it some 55 ms of CPU, taken
from the fires. Here a family's metric name and label names are checked once per scrape,
label values are escaped only when they hold a character that needs it, and the lines
are otherwise the same, byte for byte (labels sorted by name, values by
``floatToGoString``).

A ``SeriesFamily`` (the scheduler's own counters and per-job gauges: nearly every line)
goes further: it holds its series as label values and a number, and each label set's
``{...}`` is rendered once and kept by its owner, so a scrape writes one formatted line per
series and builds no ``Sample`` at all; its ``samples`` are made only when something other
than ``exposition`` reads them (``generate_latest``, ``get_sample_value``).

Invariant: anything this writer does not reproduce exactly — a type other than counter,
gauge, histogram, summary or unknown, an OpenMetrics ``_created``/``_gsum``/``_gcount``
sample, a timestamp, a name that needs escaping — hands the whole registry to
``generate_latest`` instead, so the output never differs from it.

This module imports prometheus_client (an optional extra) at once: ``scheduler.metrics``
and ``scheduler.http`` import it inside the functions that run only with metrics on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

__all__ = ["SeriesFamily", "exposition"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: the types written as they are (``unknown`` under its text-format name)
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary", "unknown": "untyped"}


class _Unsupported(Exception):
    """A family this writer does not reproduce exactly."""


#: label values -> their rendered ``{name="value",...}``, kept by a family's owner across scrapes
RenderedLabels = dict[tuple[str, ...], str]


class SeriesFamily(Metric):
    """A counter or gauge family given as ``(label values, value)`` pairs, in the order
    they are written. ``rendered`` caches each label set's text across scrapes: its owner
    keeps it, bounded by the label sets it has, and shares it only between families of
    the same label names (the text is keyed by the values alone). A counter's ``name`` is
    given without ``_total``, as ``CounterMetricFamily`` keeps it."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        label_names: Sequence[str],
        series: Sequence[tuple[tuple[str, ...], float]],
        rendered: RenderedLabels,
    ) -> None:
        if typ not in ("counter", "gauge"):
            raise ValueError(f"a SeriesFamily is a counter or a gauge, not {typ!r}")
        self._made: list[Sample] | None = None
        super().__init__(name, documentation, typ)
        self._made = None  # Metric's own [] above: the samples are made on first read
        self.sample_name = name + "_total" if typ == "counter" else name
        self.label_names = tuple(label_names)
        self.series = series
        self._rendered = rendered

    @property  # Metric's plain attribute, made on first read here
    def samples(self) -> list[Sample]:
        if self._made is None:
            names, sample = self.label_names, self.sample_name
            self._made = [Sample(sample, dict(zip(names, key, strict=True)), float(value), None, None) for key, value in self.series]
        return self._made

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        self._made = value

    def write(self, append: Callable[[str], None], float_to_go: Callable[[float], str]) -> None:
        """Append the family's sample lines (``exposition`` writes its header)."""
        if not _METRIC_NAME.fullmatch(self.sample_name):
            raise _Unsupported(self.sample_name)
        sample, rendered = self.sample_name, self._rendered
        for key, value in self.series:
            labels = rendered.get(key)
            if labels is None:
                labels = rendered[key] = self._render(key)
            # floatToGoString is repr() below 1e6 (it only writes large numbers otherwise)
            number = repr(float(value)) if -math.inf < value < 1e6 else float_to_go(value)
            append(f"{sample}{labels} {number}\n")

    def _render(self, key: tuple[str, ...]) -> str:
        if not key:
            return ""
        pairs = []
        for name, value in sorted(zip(self.label_names, key, strict=True)):
            if not _LABEL_NAME.fullmatch(name):
                raise _Unsupported(name)
            pairs.append(f'{name}="{_escape(value)}"')
        return "{" + ",".join(pairs) + "}"


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def exposition(registry: Any) -> bytes:
    """``generate_latest(registry)``, written faster when every family allows it."""
    try:
        return _write(registry)
    except _Unsupported:
        from prometheus_client import generate_latest

        return bytes(generate_latest(registry))


def _write(registry: Any) -> bytes:
    from prometheus_client import utils

    float_to_go: Callable[[float], str] = utils.floatToGoString  # untyped in prometheus_client
    out: list[str] = []
    append = out.append
    label_names: set[str] = set()
    for metric in registry.collect():
        mtype = _TYPES.get(metric.type)
        if mtype is None:
            raise _Unsupported(metric.type)
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        if not _METRIC_NAME.fullmatch(name):
            raise _Unsupported(name)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        if isinstance(metric, SeriesFamily):
            metric.write(append, float_to_go)
            continue
        openmetrics_only = {metric.name + suffix for suffix in ("_created", "_gsum", "_gcount")}
        sample_names: set[str] = set()
        for sample in metric.samples:
            sample_name = sample.name
            if sample_name not in sample_names:
                if sample_name in openmetrics_only or not _METRIC_NAME.fullmatch(sample_name):
                    raise _Unsupported(sample_name)
                sample_names.add(sample_name)
            if sample.timestamp is not None:
                raise _Unsupported("timestamp")
            labels = sample.labels
            if not labels:
                append(f"{sample_name} {float_to_go(sample.value)}\n")
                continue
            pairs = []
            for key in sorted(labels):
                if key not in label_names:
                    if not _LABEL_NAME.fullmatch(key):
                        raise _Unsupported(key)
                    label_names.add(key)
                pairs.append(f'{key}="{_escape(labels[key])}"')
            append(f"{sample_name}{{{','.join(pairs)}}} {float_to_go(sample.value)}\n")
    return "".join(out).encode("utf-8")
