"""Loaded by every llmir subprocess the registry tests start (via PYTHONPATH): no internet."""

from registry_netguard import install

install()
