"""The data: file formats and the Dataset (formats), the embedded problem (problem), the
numba parser (parse), and how ranks get their share (readers). Command line:
python -m asgd.data generate | convert | check."""

from .. import BadInput

READERS = ("sequential", "parallel")  # how ranks read a data file: asgd.data.readers


class DataError(BadInput):
    """Bad input data; the message names the file and, where it can, the line. (Here, below
    every module of the package: formats, labels and the parser all raise it.)"""
