"""One Prometheus text out of several replicas' `/metrics` texts (`llmir serve --ray`).

Each replica renders its own metrics (`metrics.Metrics.render`); the merged text keeps every
metric family once (its `# HELP` and `# TYPE` lines, then the samples of every replica), each
sample labelled with the replica it came from (`replica="ID"`), and adds
`llmir_replica_info{replica, pid, node} 1` per replica, so a scrape of any replica shows the
whole deployment: per-replica queue depth (`llmir_queue_depth`), token rate
(`llmir_tokens_per_second`), counters and histograms.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)$")


@dataclass
class _Family:
    help: str = ""
    type: str = ""
    samples: list[str] = field(default_factory=list)


def _quote(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labelled(line: str, replica: str) -> str:
    """A sample line with replica="ID" first among its labels ("" for a line that is no sample)."""
    m = _SAMPLE.match(line)
    if m is None:
        return ""
    name, labels, value = m.groups()
    inner = labels[1:-1] if labels else ""
    rep = f'replica="{_quote(replica)}"'
    return f"{name}{{{rep}{',' + inner if inner else ''}}} {value}"


def _family_of(sample: str, families: Mapping[str, _Family]) -> str:
    """The family a sample belongs to (a histogram's _bucket/_sum/_count samples: their base)."""
    name = sample.split("{", 1)[0].split(" ", 1)[0]
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def merge(texts: Mapping[str, str], info: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """texts: replica id -> its Prometheus text; info: replica id -> extra labels of
    `llmir_replica_info` (pid, node). Replicas in sorted order, families in first-seen order."""
    families: dict[str, _Family] = {}
    for replica in sorted(texts):
        for line in texts[replica].splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                _, kind, name, *rest = line.split(" ", 3)
                fam = families.setdefault(name, _Family())
                setattr(fam, kind.lower(), " ".join(rest))
            elif line and not line.startswith("#"):
                sample = _labelled(line, replica)
                if sample:
                    families.setdefault(_family_of(line, families), _Family()).samples.append(
                        sample
                    )
    out: list[str] = []
    for name, fam in families.items():
        if fam.help:
            out.append(f"# HELP {name} {fam.help}")
        if fam.type:
            out.append(f"# TYPE {name} {fam.type}")
        out += fam.samples
    out += [
        "# HELP llmir_replica_info One per live replica: its process and node.",
        "# TYPE llmir_replica_info gauge",
    ]
    for replica in sorted(texts):
        extra = "".join(
            f',{k}="{_quote(str(v))}"' for k, v in sorted((info or {}).get(replica, {}).items())
        )
        out.append(f'llmir_replica_info{{replica="{_quote(replica)}"{extra}}} 1')
    return "\n".join(out) + "\n"


__all__ = ["merge"]
