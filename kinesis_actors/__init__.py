"""kinesis_actors: read Amazon Kinesis Data Streams on a Ray cluster (filled in as modules land)."""

__version__ = "0.1.0"
