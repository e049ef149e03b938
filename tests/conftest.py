"""Test setup: Triton's interpreter (before anything imports triton) and hypothesis profiles.

``HYPOTHESIS_PROFILE=thorough pytest`` runs many more examples than the default ``ci`` profile.
"""

import os

# Triton kernels run on CPU tensors only under the interpreter, which must be chosen before
# triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# CI draws the same examples every run (derandomize) so a result is reproducible; the thorough
# profile explores new ones each time.
settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
