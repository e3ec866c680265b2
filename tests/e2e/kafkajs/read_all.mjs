// kafkajs reads one partition from offset 0 up to END (exclusive) and prints every record as
// JSON lines of [offset, key, value] (base64, null kept), then one line {"done": true}.
// A plain consumer: no group offsets are committed. Usage: node read_all.mjs BOOTSTRAP TOPIC END
import kafkajs from 'kafkajs'

const { Kafka, logLevel } = kafkajs
const [bootstrap, topic, endArg] = process.argv.slice(2)
const end = BigInt(endArg)
const DEADLINE_MS = 90_000

const kafka = new Kafka({ clientId: 'raylog-read-all', brokers: bootstrap.split(','), logLevel: logLevel.ERROR })
const consumer = kafka.consumer({ groupId: `read-all-${Date.now()}`, maxWaitTimeInMs: 200 })
await consumer.connect()
await consumer.subscribe({ topic, fromBeginning: true })
const rows = []
const b64 = (buf) => (buf === null ? null : buf.toString('base64'))
let finish
const finished = new Promise((resolve) => { finish = resolve })
await consumer.run({
  autoCommit: false,
  eachMessage: async ({ message }) => {
    rows.push([message.offset, b64(message.key), b64(message.value)])
    if (BigInt(message.offset) >= end - 1n) finish(true)
  },
})
const timer = setTimeout(() => finish(false), DEADLINE_MS)
const done = await finished
clearTimeout(timer)
await consumer.disconnect()
for (const row of rows) console.log(JSON.stringify(row))
console.log(JSON.stringify({ done }))
process.exit(done ? 0 : 1)
