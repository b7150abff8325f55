"""shardjob's version, defined once: ``VERSION`` here, which pyproject reads as the
package's version (``[tool.setuptools.dynamic]``), so a release bumps one place.

Not read from the installed metadata: ``importlib.metadata`` brings ``email``, ``zipfile``
and ``csv`` with it, about 4.6 MiB of a worker's RSS for one string, and an editable
install would report the version it was installed with rather than the source's.
"""

from __future__ import annotations

__all__ = ["VERSION"]

VERSION = "0.2.0"

