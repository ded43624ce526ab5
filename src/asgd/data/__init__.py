"""The data: file formats and the Dataset (formats), the embedded problem (problem), the
numba parser (parse), and how ranks get their share (readers). Command line:
python -m asgd.data generate | convert | check."""

READERS = ("sequential", "parallel")  # how ranks read a data file: asgd.data.readers
