// The amqplib anchor of benchmarks/hotpath.py (run by it; not on its own):
//   node bench.js URL N WINDOW PREFETCH
// publishes N messages of the same 256-byte body through a confirm channel with at most
// WINDOW unconfirmed (each publish's confirm callback frees a slot), then consumes them
// with basic.qos PREFETCH, acking each, and prints {"publish_s": ..., "consume_s": ...}.
// Node's event loop is single-threaded, as asyncio's is: the same shape of client.
"use strict";
const amqplib = require("amqplib");

async function main() {
  const [url, nArg, windowArg, prefetchArg] = process.argv.slice(2);
  const n = Number(nArg), window = Number(windowArg), prefetch = Number(prefetchArg);
  const body = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  const conn = await amqplib.connect(url);
  try {
    const ch = await conn.createConfirmChannel();
    const { queue } = await ch.assertQueue("", { exclusive: true });

    let t0 = process.hrtime.bigint();
    await new Promise((resolve, reject) => {
      let sent = 0, confirmed = 0, inFlight = 0, failed = null;
      const pump = () => {
        // publish() returns false when the socket's buffer is full: wait for 'drain'.
        while (sent < n && inFlight < window) {
          sent++; inFlight++;
          const more = ch.sendToQueue(queue, body, {}, (err) => {
            inFlight--; confirmed++;
            if (err && !failed) { failed = err; reject(err); }
            if (confirmed === n) resolve();
            else if (!failed) pump();
          });
          if (!more) { ch.once("drain", pump); return; }
        }
      };
      pump();
    });
    const publishS = Number(process.hrtime.bigint() - t0) / 1e9;

    await ch.prefetch(prefetch);
    t0 = process.hrtime.bigint();
    let consumerTag = null;
    await new Promise((resolve, reject) => {
      let count = 0;
      ch.consume(queue, (msg) => {
        if (msg === null) { reject(new Error("consumer cancelled by the broker")); return; }
        ch.ack(msg);
        if (++count === n) resolve();
      }).then((ok) => { consumerTag = ok.consumerTag; }, reject);
    });
    const consumeS = Number(process.hrtime.bigint() - t0) / 1e9;
    await ch.cancel(consumerTag);
    await ch.deleteQueue(queue);
    process.stdout.write(JSON.stringify({ publish_s: publishS, consume_s: consumeS }) + "\n");
  } finally {
    await conn.close();
  }
}

main().catch((err) => {
  process.stderr.write(`amqplib bench: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
