"""Data in: tables imported as sealed, fingerprinted Parquet blocks in the block store."""
