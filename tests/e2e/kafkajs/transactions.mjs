// kafkajs transactions against raylog: a committed, an aborted and a committed transaction over
// three partitions, then a read_committed consumer group from the beginning: it has read past
// the aborted records once it has the last transaction's. Prints one JSON
// document; tests/e2e/test_transactions.py checks it. Usage: node transactions.mjs BOOTSTRAP TOPIC
import kafkajs from 'kafkajs'

const { Kafka, logLevel } = kafkajs

const [bootstrap, topic] = process.argv.slice(2)
const DEADLINE_MS = 60_000
const kafka = new Kafka({
  clientId: 'raylog-kafkajs-txn',
  brokers: bootstrap.split(','),
  logLevel: logLevel.ERROR,
  retry: { retries: 10 },
})

const producer = kafka.producer({ transactionalId: 'kafkajs-txn', maxInFlightRequests: 1, idempotent: true })
await producer.connect()
const committed = []
for (const outcome of ['commit', 'abort', 'commit-after']) {
  const tx = await producer.transaction()
  const values = [0, 1, 2, 3, 4, 5].map(i => `kafkajs-${outcome}-${i}`)
  await tx.send({ topic, messages: values.map((value, i) => ({ value, partition: i % 3 })) })
  if (outcome === 'abort') {
    await tx.abort()
  } else {
    await tx.commit()
    committed.push(...values)
  }
}
await producer.disconnect()

const consumer = kafka.consumer({ groupId: 'kafkajs-txn-read', readUncommitted: false })
await consumer.connect()
await consumer.subscribe({ topic, fromBeginning: true })
const received = []
const deadline = Date.now() + DEADLINE_MS
await consumer.run({
  eachMessage: async ({ message }) => {
    const value = message.value.toString()
    if (value.startsWith('kafkajs-')) received.push(value)
  },
})
while (received.length < committed.length && Date.now() < deadline) {
  await new Promise(resolve => setTimeout(resolve, 200))
}
await consumer.disconnect()
console.log(JSON.stringify({ committed, received }))
