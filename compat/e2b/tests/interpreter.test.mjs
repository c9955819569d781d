// The code interpreter through the unmodified @e2b/code-interpreter SDK.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

let sbx

before(async () => {
  sbx = await Sandbox.create()
})

after(async () => {
  await sbx?.kill().catch(() => {})
})

test('create gives a code-interpreter-v1 sandbox', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'code-interpreter-v1')
})

test('the value of the last expression is the main result', async () => {
  const e = await sbx.runCode('1 + 1')
  assert.equal(e.error, undefined)
  assert.equal(e.results.length, 1)
  assert.equal(e.results[0].text, '2')
  assert.equal(e.results[0].isMainResult, true)
  assert.equal(e.text, '2')
})

test('state is kept across runCode calls', async () => {
  await sbx.runCode('x = 41\ndef inc(v):\n    return v + 1')
  const e = await sbx.runCode('inc(x)')
  assert.equal(e.text, '42')
})

test('stdout and stderr come back as logs', async () => {
  const out = []
  const e = await sbx.runCode('import sys\nprint("hello")\nprint("warn", file=sys.stderr)', {
    onStdout: (m) => out.push(m.line),
  })
  assert.deepEqual(e.logs.stdout, ['hello\n'])
  assert.deepEqual(e.logs.stderr, ['warn\n'])
  assert.deepEqual(out, ['hello\n'])
  assert.equal(e.results.length, 0)
})

test('an exception comes back as the execution error', async () => {
  const e = await sbx.runCode('a = 1\nb = 0\na / b')
  assert.ok(e.error, 'no error')
  assert.equal(e.error.name, 'ZeroDivisionError')
  assert.equal(e.error.value, 'division by zero')
  assert.match(e.error.traceback, /a \/ b/)
  // The kernel survives: state is still there.
  assert.equal((await sbx.runCode('a')).text, '1')
})

test('a syntax error is an error too', async () => {
  const e = await sbx.runCode('def (')
  assert.equal(e.error.name, 'SyntaxError')
})

test('a matplotlib chart comes back as a PNG', async () => {
  const e = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title("t")\nplt.show()')
  assert.equal(e.error, undefined)
  const pngs = e.results.filter((r) => r.png)
  assert.equal(pngs.length, 1)
  const bytes = Buffer.from(pngs[0].png, 'base64')
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
  assert.ok(bytes.length > 1000)
  // The figure was closed: the next cell shows none.
  assert.equal((await sbx.runCode('1')).results.filter((r) => r.png).length, 0)
})

test('a pandas DataFrame comes back as text and HTML', async () => {
  const e = await sbx.runCode('import pandas as pd\ndf = pd.DataFrame({"a": [1, 2], "b": [3, 4]})\ndf')
  assert.equal(e.error, undefined)
  assert.match(e.results[0].text, /a\s+b/)
  assert.match(e.results[0].html, /<table/)
})

test('code contexts keep their own state', async () => {
  const ctx = await sbx.createCodeContext()
  assert.ok(ctx.id)
  await sbx.runCode('only_here = 5', { context: ctx })
  assert.equal((await sbx.runCode('only_here', { context: ctx })).text, '5')
  const e = await sbx.runCode('only_here')
  assert.equal(e.error.name, 'NameError')
  const list = await sbx.listCodeContexts()
  assert.ok(list.some((c) => c.id === ctx.id))
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode('only_here', { context: ctx })).error.name, 'NameError')
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
})

test('a context starts in its cwd and stays where a cell moved it', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal(ctx.cwd, '/tmp')
  assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text, "'/tmp'")
  await sbx.runCode("os.chdir('/opt')", { context: ctx })
  assert.equal((await sbx.runCode('os.getcwd()', { context: ctx })).text, "'/opt'")
  await sbx.removeCodeContext(ctx)
})

test('commands and files work in the interpreter sandbox', async () => {
  await sbx.runCode('open("/workspace/from_py.txt", "w").write("py")')
  assert.equal(await sbx.files.read('from_py.txt'), 'py')
  assert.equal((await sbx.commands.run('python3 -c "print(6*7)"')).stdout, '42\n')
})

test('a dataset written to /home/user is read by code there', async () => {
  // The pattern of E2B's own examples: upload a CSV to the home
  // directory, analyse it with pandas under its absolute path.
  await sbx.files.write('/home/user/data.csv', 'x,y\n1,2\n3,4\n5,6\n')
  const e = await sbx.runCode("import pandas as pd\ndf = pd.read_csv('/home/user/data.csv')\nint(df['y'].sum())")
  assert.equal(e.error, undefined, e.error && e.error.traceback)
  assert.equal(e.text, '12')
})
