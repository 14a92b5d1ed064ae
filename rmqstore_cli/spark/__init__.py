"""rmqstore on Apache Spark: a ``rocketmq`` Python data source and distributed jobs.

Nothing here is imported by the rest of the CLI unless a ``spark`` command runs, so
pyspark stays an optional dependency (``pip install rmqstore[spark]``).
"""
