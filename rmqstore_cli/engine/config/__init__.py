"""The broker's configuration, read offline.

- storeconfig: store geometry and the settings that change how bytes are read (MessageStoreConfig, broker.conf)
- files: ``config/*.json`` as ConfigManager.load reads them (main file, .bak fallback)
- offsets: consumer offsets against the consume queues (ConsumerOffsetManager, getMessage's correction)

Plans that rewrite these files are in ``repair.config_plan`` (they search the queues and the index).
"""
