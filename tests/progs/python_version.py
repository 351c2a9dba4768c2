"""Prints the running interpreter's full version (platform.python_version())."""

import platform

print(platform.python_version())
