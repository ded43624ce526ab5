"""Write examples/penguins.csv and examples/penguins-new.csv: synthetic data in the shape of
the Palmer penguins table (the real one cannot be fetched everywhere, and the README's
own-data example must run on a fresh clone).

Each species' rows are drawn from a normal distribution per feature, with the per-species
means and standard deviations of the real data (rounded); the counts are the real table's
(152 Adelie, 68 Chinstrap, 124 Gentoo). The labels are text, as in the real file.

    python examples/make_penguins.py [FOLDER]   # both files, the same bytes every time
                                                # (default: beside this script)
"""

import sys
from pathlib import Path

import numpy as np

COLUMNS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
# species: (rows, means, standard deviations), in COLUMNS' order
SPECIES = {
    "Adelie": (152, (38.8, 18.3, 190.0, 3700.0), (2.7, 1.2, 6.5, 460.0)),
    "Chinstrap": (68, (48.8, 18.4, 196.0, 3733.0), (3.3, 1.1, 7.1, 384.0)),
    "Gentoo": (124, (47.5, 15.0, 217.0, 5076.0), (3.1, 1.0, 6.5, 504.0)),
}
NEW_ROWS = 6  # rows without a label, for asgd.predict
HERE = Path(__file__).resolve().parent


def rows(rng):
    out = []
    for name, (n, mean, sd) in SPECIES.items():
        values = rng.normal(mean, sd, size=(n, len(COLUMNS)))
        out += [(v, name) for v in values]
    return [out[i] for i in rng.permutation(len(out))]


def line(values):
    *lengths, mass = values
    return ",".join([f"{x:.1f}" for x in lengths] + [f"{mass:.0f}"])


def main(here: Path = HERE):
    rng = np.random.default_rng(0)
    data = rows(rng)
    with open(here / "penguins.csv", "w") as f:
        f.write(",".join(COLUMNS + ("species",)) + "\n")
        f.writelines(f"{line(v)},{name}\n" for v, name in data)
    with open(here / "penguins-new.csv", "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        f.writelines(f"{line(v)}\n" for v, _ in rows(rng)[:NEW_ROWS])


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:2]))
