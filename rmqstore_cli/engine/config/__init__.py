"""The broker's configuration, read offline.

- storeconfig: store geometry and the settings that change how bytes are read (MessageStoreConfig, broker.conf)
- files: ``config/*.json`` as ConfigManager.load reads them (main file, .bak fallback)
- repair: plans that restore or rebuild those files and set committed offsets
- offsets: consumer offsets against the consume queues (ConsumerOffsetManager, getMessage's correction)
"""
