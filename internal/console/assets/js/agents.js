// agents.js: the tenant's agents (GET /v1/agents) and, when one is
// selected, its definition with its instructions (GET /v1/agents/{name}).
// The page shows the agents as new Runs get them: a Run keeps the version
// it was created with, which its own page shows.

import {el, replace, pretty} from './dom.js';
import {api, ApiError, NetworkError} from './api.js';
import {agentHash, listHash} from './route.js';

// chooseAgent is the agent a new Run is started with when the person has
// not chosen one: preferred (the agent the list is filtered by) when the
// tenant has it, else "default", which the API runs a submission without
// an agent as, else the first (pure, so that node tests it).
export function chooseAgent(names, preferred = '') {
  if (preferred && names.includes(preferred)) return preferred;
  if (names.includes('default')) return 'default';
  return names.length ? names[0] : '';
}

// settingsText renders an agent's model settings on one line, in the
// order the API gives them: strings as they are, anything else as JSON
// ("model: gpt-4o, temperature: 0.2"); none is "none".
export function settingsText(settings) {
  if (!settings || typeof settings !== 'object') return 'none';
  const bits = Object.entries(settings).map(([k, v]) => k + ': ' + (typeof v === 'string' ? v : JSON.stringify(v)));
  return bits.length ? bits.join(', ') : 'none';
}

// limitsText renders an agent's limits ("0s" is no timeout).
export function limitsText(l) {
  if (!l) return '';
  const t = (v) => (!v || v === '0s' ? 'none' : v);
  return l.max_steps + ' steps, ' + l.max_tool_calls_per_step + ' tool calls a step (' + l.max_parallel_tool_calls +
    ' at once), Run timeout ' + t(l.run_timeout) + ', effect timeout ' + t(l.effect_timeout);
}

// agentsPage renders the list into main, and the agent named name below
// it when name is set. It returns a function that stops it. The agents
// change only when the server reads its config again (at a restart): the
// page reads them once.
export function agentsPage(main, name, {notice}) {
  let stopped = false;
  const body = el('tbody', {id: 'agents-body'});
  const state = el('p', {class: 'muted', id: 'agents-state', text: 'Loading…'});
  const detail = el('section', {class: 'card', id: 'agent-detail', hidden: !name}, el('p', {class: 'muted', text: 'Loading…'}));
  replace(main,
    el('p', {class: 'crumbs'}, name ? [el('a', {href: '#/agents', text: 'Agents'}), ' / ', el('span', {class: 'mono', text: name})] : 'Agents'),
    el('section', {class: 'card', id: 'agents'},
      el('h2', {text: 'Agents'}),
      el('p', {class: 'muted', text: 'The agents of this tenant, as a Run started now gets them. A Run keeps the version ' +
        'it was started with for its whole life; its page shows it. Select an agent to read its instructions.'}),
      el('table', {class: 'agents'}, el('thead', {}, el('tr', {}, ['agent', 'version', 'description', 'model', 'settings', 'tools', '']
        .map(h => el('th', {text: h})))), body),
      state),
    detail);

  async function loadList() {
    try {
      const list = await api.agents();
      if (stopped) return;
      body.replaceChildren(...list.agents.map(a => el('tr', {class: 'agent' + (a.name === name ? ' selected' : ''), dataset: {agent: a.name}},
        el('td', {}, el('a', {class: 'mono agent-name', href: agentHash(a.name), text: a.name})),
        el('td', {class: 'mono agent-version', text: a.version}),
        el('td', {class: 'agent-description', text: a.description || ''}),
        el('td', {class: 'mono agent-model', text: a.model.plugin}),
        el('td', {class: 'agent-settings', text: settingsText(a.model.settings)}),
        el('td', {class: 'agent-tools'}, toolList(a.tools)),
        el('td', {}, el('a', {href: listHash('#/runs', {agent: a.name}), text: 'Runs'})))));
      state.textContent = list.agents.length === 1 ? '1 agent.' : list.agents.length + ' agents.';
    } catch (e) {
      if (stopped) return;
      state.textContent = e instanceof NetworkError ? 'The server does not answer: reload the page to try again.'
        : 'Could not read the agents: ' + e.message;
    }
  }

  async function loadDetail() {
    try {
      const a = await api.agent(name);
      if (stopped) return;
      replace(detail,
        el('h2', {}, 'Agent ', el('span', {class: 'mono', text: a.name}), ' ', el('span', {class: 'mono muted', id: 'agent-detail-version', text: a.version})),
        el('dl', {class: 'facts'},
          a.description ? [el('dt', {text: 'description'}), el('dd', {text: a.description})] : null,
          el('dt', {text: 'builder'}), el('dd', {class: 'mono', text: a.builder}),
          el('dt', {text: 'model'}), el('dd', {class: 'mono', text: a.model.plugin}),
          el('dt', {text: 'settings'}), el('dd', {}, a.model.settings ? el('pre', {id: 'agent-settings', text: pretty(a.model.settings)}) : 'none'),
          el('dt', {text: 'limits'}), el('dd', {text: limitsText(a.limits)}),
          el('dt', {text: 'history'}), el('dd', {text: a.history_runs + ' earlier Run' + (a.history_runs === 1 ? '' : 's') + ' of the session'}),
          el('dt', {text: 'Runs'}), el('dd', {}, el('a', {href: listHash('#/runs', {agent: a.name}), id: 'agent-runs', text: 'its Runs, and start one'}))),
        el('h2', {text: 'Instructions'}),
        a.instructions ? el('pre', {class: 'instructions', id: 'agent-instructions', text: a.instructions})
          : el('p', {class: 'muted', id: 'agent-instructions', text: 'None: the builder\'s own config decides the system prompt.'}),
        el('h2', {text: 'Tools'}),
        a.tools.length ? el('table', {class: 'agent-tools'}, el('thead', {}, el('tr', {}, ['tool', 'carried out by', 'approval', 'description'].map(h => el('th', {text: h})))),
          el('tbody', {}, a.tools.map(t => el('tr', {dataset: {tool: t.name}},
            el('td', {class: 'mono', text: t.name}), el('td', {class: 'tool-by'}, toolBy(t)),
            el('td', {text: t.approval}), el('td', {text: t.description || ''})))))
          : el('p', {class: 'muted', text: 'No tools: its Runs answer from the model alone.'}));
    } catch (e) {
      if (stopped) return;
      if (e instanceof ApiError && e.notFound) {
        // The API's message names the agents the tenant has.
        replace(detail, el('h2', {text: 'Agent not found'}), el('p', {id: 'agent-not-found', text: e.message}));
        return;
      }
      replace(detail, el('p', {class: 'error', text: 'Could not read the agent: ' + e.message}));
      if (!(e instanceof NetworkError)) notice(e.message, 'error');
    }
  }

  loadList();
  if (name) loadDetail();
  return () => { stopped = true; };
}

// toolList shows an agent's tools by name, each with its approval, and
// for a tool that is another agent, that agent with its link.
function toolList(tools) {
  if (!tools || !tools.length) return el('span', {class: 'muted', text: 'none'});
  return tools.map(t => el('div', {class: 'tool', dataset: t.agent ? {tool: t.name, approval: t.approval, agent: t.agent} : {tool: t.name, approval: t.approval}},
    el('span', {class: 'mono', text: t.name}), ' ',
    t.agent ? [el('span', {class: 'tool-by'}, '(', toolBy(t), ')'), ' '] : null,
    el('span', {class: 'badge tool-approval-' + (t.approval === 'always' ? 'always' : 'never'),
      text: t.approval === 'always' ? 'approval' : 'no approval'})));
}

// toolBy shows what carries a tool out: "agent research" (its link) for
// an agent tool, each call of which is a child Run of that agent, else
// the executor plugin.
function toolBy(t) {
  if (t.agent) return ['agent ', el('a', {class: 'mono tool-agent', href: agentHash(t.agent), text: t.agent})];
  return el('span', {class: 'mono', text: t.plugin || ''});
}
