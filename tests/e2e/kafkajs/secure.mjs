// kafkajs over SASL_SSL, or SSL with a client certificate: produce COUNT records, read them back
// with a consumer group. Prints one JSON document ({sent, received} or {error});
// tests/e2e/test_client_security.py checks it.
// Usage: node secure.mjs BOOTSTRAP TOPIC MECHANISM USER PASSWORD CA_FILE
//        node secure.mjs BOOTSTRAP TOPIC ssl CERT_FILE KEY_FILE CA_FILE
import { readFileSync } from 'node:fs'
import kafkajs from 'kafkajs'

const { Kafka, logLevel } = kafkajs

const [bootstrap, topic, mechanism, first, second, caFile] = process.argv.slice(2)
const ca = [readFileSync(caFile, 'utf-8')]
const security = mechanism === 'ssl'
  ? { ssl: { ca, cert: readFileSync(first, 'utf-8'), key: readFileSync(second, 'utf-8') } }
  : { ssl: { ca }, sasl: { mechanism, username: first, password: second } }
const COUNT = 20
const DEADLINE_MS = 60_000
const kafka = new Kafka({
  clientId: 'raylog-kafkajs-secure',
  brokers: bootstrap.split(','),
  logLevel: logLevel.NOTHING,
  ...security,
  retry: { retries: 2 },
})

try {
  const producer = kafka.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  const sent = []
  for (let i = 0; i < COUNT; i++) sent.push(`${mechanism}-${i}`)
  await producer.send({ topic, acks: -1, messages: sent.map((v) => ({ value: v })) })
  await producer.disconnect()

  const consumer = kafka.consumer({
    groupId: `g-${mechanism}`, sessionTimeout: 10_000, maxWaitTimeInMs: 500,
  })
  await consumer.connect()
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  const received = []
  let resolveAll
  const all = new Promise((resolve) => { resolveAll = resolve })
  await consumer.run({
    eachMessage: async ({ message }) => {
      const value = message.value.toString()
      if (value.startsWith(`${mechanism}-`)) received.push(value)
      if (received.length >= sent.length) resolveAll()
    },
  })
  let timer
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, DEADLINE_MS) })
  await Promise.race([all, timeout])
  clearTimeout(timer) // else it keeps the process alive until the deadline
  await consumer.disconnect()
  console.log(JSON.stringify({ sent, received }))
} catch (e) {
  console.log(JSON.stringify({ error: `${e.name}: ${e.message}` }))
}
