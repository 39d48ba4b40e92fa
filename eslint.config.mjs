// ESLint (flat config): the recommended JavaScript and TypeScript rules over every source, test,
// benchmark and script. Formatting is prettier's (.prettierrc.json), not ESLint's.
import js from '@eslint/js'
import globals from 'globals'
import tseslint from 'typescript-eslint'

export default tseslint.config(
  {ignores: ['dist/**', '.dist-*/**', 'reports/**', 'coverage/**', '.stryker-tmp*/**', '.test-tmp/**', '.bench-tmp/**', 'node_modules/**', '.ci-node22/**']},
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {languageOptions: {globals: {...globals.node}}},
  {
    // Tests read --json documents and replies of many shapes; the JSON contract test checks those
    // shapes with the documented schemas, so elsewhere in tests `any` for them is allowed.
    files: ['test/**'],
    rules: {'@typescript-eslint/no-explicit-any': 'off'},
  },
  {
    rules: {
      // `catch {}` that deliberately ignores a failure (a best-effort cleanup) is common here and
      // always says so next to it; empty blocks elsewhere are still errors.
      'no-empty': ['error', {allowEmptyCatch: true}],
      // Control characters in patterns are the point where they appear here: JSON and identifier
      // rules name the bytes below 0x20 that they refuse.
      'no-control-regex': 'off',
      // Unused arguments are part of a signature (handlers, callbacks): only `_`-prefixed ones.
      '@typescript-eslint/no-unused-vars': ['error', {argsIgnorePattern: '^_', caughtErrors: 'none'}],
    },
  },
)
