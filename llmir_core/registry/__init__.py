"""The model registry: resolve `name:tag`, `hf:ORG/REPO[@REV]` or a PATH to verified local
files, pin them in llmir.lock, and reproduce them from the lock, online or offline.

`resolve_model_ref` is the entry point for commands that take a model (`llmir import`).
"""

from .home import hub_settings, llmir_home
from .index import Entry, FileSpec, Index, load_index, shipped_index_path
from .lockfile import LOCK_FILE, PROJECT_FILE, Lock, LockedFile, ProjectConfig, read_lock
from .mirror import MirrorResult, write_mirror
from .project import InitResult, init_project
from .pull import PulledFile, PullResult, pull, resolve_model_ref, sha256_file
from .refs import HfRef, PathRef, RegistryRef, parse_ref

__all__ = [
    "LOCK_FILE",
    "PROJECT_FILE",
    "Entry",
    "FileSpec",
    "HfRef",
    "Index",
    "InitResult",
    "Lock",
    "LockedFile",
    "MirrorResult",
    "PathRef",
    "ProjectConfig",
    "PullResult",
    "PulledFile",
    "RegistryRef",
    "hub_settings",
    "init_project",
    "llmir_home",
    "load_index",
    "parse_ref",
    "pull",
    "read_lock",
    "resolve_model_ref",
    "sha256_file",
    "shipped_index_path",
    "write_mirror",
]
