"""Measured costs: ``tag profile`` times every op of a train step on the device at hand and the
communication between processes of this host, and the cost model reads what it wrote.

Layers: :mod:`tag.profile.data` (the file and its data model) is a leaf that ``tag.cluster`` and
``tag.cost`` read; :mod:`tag.profile.ops`, :mod:`tag.profile.comm`, :mod:`tag.profile.executor`,
:mod:`tag.profile.timeline`, :mod:`tag.profile.report` and :mod:`tag.profile.cli` measure and report,
importing ``tag.execute`` and ``torch``, and are imported only by the command line and scripts. This
``__init__`` re-exports the data model alone, so importing it stays cheap.
"""

from tag.profile.data import (
    PROFILE_FORMAT,
    PROFILE_SCHEMA_VERSION,
    CommCurve,
    DeviceProfile,
    ModelTimes,
    Profile,
    fit_linear,
    load_profile,
    save_profile,
    structure_fingerprint,
)

__all__ = ["Profile", "DeviceProfile", "ModelTimes", "CommCurve", "load_profile", "save_profile", "fit_linear",
           "structure_fingerprint", "PROFILE_FORMAT", "PROFILE_SCHEMA_VERSION"]
