"""Identification from low-rate data: trajectory files and tuples (``dataset``), live
stream alignment (``streaming``), the recurrent progressive trainer (``trainer``)."""
