"""Object storage: inputs staged from URLs into a node cache, outputs uploaded to a URL.

Everything goes through fsspec and the store's own library (adlfs, s3fs, gcsfs, aiohttp), the
``storage`` extra; a URL whose library is missing is refused naming that extra. See
docs/storage.md.
"""
