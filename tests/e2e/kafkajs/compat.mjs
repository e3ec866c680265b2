// kafkajs against raylog: admin, produce (acks 0/1/all, gzip), a consumer group, committed
// offsets, offsets by timestamp, configs. Prints one JSON document; tests/clients/test_kafkajs.py
// checks it. Usage: node compat.mjs BOOTSTRAP TOPIC
import kafkajs from 'kafkajs'

const { CompressionTypes, ConfigResourceTypes, Kafka, logLevel } = kafkajs

const [bootstrap, topic] = process.argv.slice(2)
const DEADLINE_MS = 90_000
const PER_SEND = 20
const kafka = new Kafka({
  clientId: 'raylog-kafkajs-compat',
  brokers: bootstrap.split(','),
  logLevel: logLevel.ERROR,
  retry: { retries: 8 },
})

const admin = kafka.admin()
await admin.connect()
const created = await admin.createTopics({
  topics: [{
    topic, numPartitions: 2, replicationFactor: 3,
    configEntries: [{ name: 'min.insync.replicas', value: '2' }],
  }],
  waitForLeaders: true,
})

const producer = kafka.producer({ allowAutoTopicCreation: false })
await producer.connect()
const sent = []
const startedAt = Date.now()
const cases = [
  { acks: -1, compression: CompressionTypes.None },
  { acks: -1, compression: CompressionTypes.GZIP },
  { acks: 1, compression: CompressionTypes.None },
  { acks: 0, compression: CompressionTypes.None },
]
for (const [c, { acks, compression }] of cases.entries()) {
  const messages = []
  for (let i = 0; i < PER_SEND; i++) {
    const key = `k-${c}-${i}`
    messages.push({ key, value: `v-${c}-${i}`, partition: i % 2, timestamp: `${startedAt + c}` })
    sent.push(key)
  }
  await producer.send({ topic, acks, compression, messages })
}
await producer.disconnect()

const groupId = `g-${topic}`
const consumer = kafka.consumer({ groupId, sessionTimeout: 10_000, heartbeatInterval: 1_000 })
await consumer.connect()
await consumer.subscribe({ topics: [topic], fromBeginning: true })
const received = []
let resolveAll
const all = new Promise((resolve) => { resolveAll = resolve })
await consumer.run({
  eachMessage: async ({ message }) => {
    received.push(message.key.toString())
    if (received.length >= sent.length) resolveAll()
  },
})
const timer = setTimeout(resolveAll, DEADLINE_MS)
await all
clearTimeout(timer)
await consumer.stop() // commits the offsets of what was processed
await consumer.disconnect()

const committed = await admin.fetchOffsets({ groupId, topics: [topic] })
const latest = await admin.fetchTopicOffsets(topic)
const byTimestamp = await admin.fetchTopicOffsetsByTimestamp(topic, startedAt + 3)
await admin.alterConfigs({
  validateOnly: false,
  resources: [{
    type: ConfigResourceTypes.TOPIC, name: topic,
    configEntries: [{ name: 'retention.ms', value: '3600000' }, { name: 'min.insync.replicas', value: '2' }],
  }],
})
const described = await admin.describeConfigs({
  includeSynonyms: false,
  resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configNames: ['retention.ms'] }],
})
await admin.disconnect()

console.log(JSON.stringify({
  created,
  sent,
  received,
  committed: committed[0].partitions.map((p) => ({ partition: p.partition, offset: p.offset })),
  latest: latest.map((p) => ({ partition: p.partition, high: p.high, low: p.low })),
  byTimestamp: byTimestamp.map((p) => ({ partition: p.partition, offset: p.offset })),
  retentionMs: described.resources[0].configEntries.map((e) => [e.configName, e.configValue]),
}))
