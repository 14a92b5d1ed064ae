"""Files derived from the commitlog, and the dispatch that writes them (the broker's reput).

- consumequeue, cqwriter: consume queues and ext files (ConsumeQueue, ConsumeQueueExt)
- index, indexwriter, indexgaps: index files (IndexService / IndexFile) and the records no index covers
- dispatchcolumns: per chunk of records, what dispatch computes (topic id, tagsCode, key hashes) as columns
- dispatch: the dispatcher chain run by ReputMessageService (CommitLogDispatcher build CQ / index)
- dispatchpredict: which consume-queue units a re-dispatch would write, without writing
- lmq, lmqparse: multi-dispatch (LMQ) units a record gets (MultiDispatchUtils, ConsumeQueue.multiDispatchLmqQueue),
  the properties of many records parsed in array operations
"""
